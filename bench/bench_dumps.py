"""Benchmarks for miniai.dumps (saving) and miniai.compare (comparing).

1. Saving: the training time that dumping adds, miniai's `register_saving_hook` (with a spare core: a copy in the hook
   and a background writer thread; without: written in the hook) against the seed tool's way (`np.save` of `.cpu().numpy()` inside the hook, on the training thread).
   Baseline CNN, random batches, every Conv2d output and every parameter gradient saved (no limits).
2. Comparing: `compare_dumps` on two folders of float32 dumps (~1 GB in all by default) against reading every
   file once with `np.load`; peak memory of the comparison measured in a fresh process.

Usage (repo root): .venv/bin/python bench/bench_dumps.py [--steps 30] [--bs 256] [--repeats 7] [--threads N] [--compare-mb 1024]
       [--compare-dtype float32|float64]
       --interleaved: with no spare core, one training run whose steps take turns (no saving / np.save / miniai), the
       estimator that file-system noise leaves usable (see `bench_interleaved`)
       --goals: both saving goals in one run (no spare core, interleaved; then a free core, whole runs)
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path

import numpy as np, torch
import torch.nn.functional as F

from _timing import Inside, clock   # the bench scripts' one timing helper
IN_HOOKS = Inside()   # seconds the training thread spent inside saving hooks
timed = IN_HOOKS.wrap

GATE = dict(seed=True, miniai=True)   # the interleaved bench switches each writer on for its own steps only

def seed_style_hooks(model, path, target='Conv2d', max_t=-1, max_g=-1):
    "The seed tool's approach: synchronous np.save in the forward hook and in the parameter hooks (with its limits)."
    tdir, gdir = Path(path)/'tensors'/'rank_0', Path(path)/'grads'/'rank_0'
    tdir.mkdir(parents=True); gdir.mkdir(parents=True)
    state = dict(t=0, g=0)
    handles = []
    @timed
    def fwd(name, mod, inp, out):
        if not GATE['seed']: return
        if 0 <= max_t <= state['t']: return
        np.save(tdir/f"tensor_idx_{state['t']}_layer_class_{target}_layer_name_{name}_micro_step_0.npy", out.detach().cpu().numpy())
        state['t'] += 1
    @timed
    def grad(name, g):
        if not GATE['seed']: return
        if 0 <= max_g <= state['g']: return
        np.save(gdir/f"tensor_idx_{state['g']}_layer_class_{target}_layer_name_{name}_micro_step_0.npy", g.detach().cpu().numpy())
        state['g'] += 1
    for n, m in model.named_modules():
        if type(m).__name__ == target:
            handles.append(m.register_forward_hook(lambda mod, i, o, n=n: fwd(n, mod, i, o)))
            for pn, p in m.named_parameters():
                handles.append(p.register_hook(lambda g, nm=f'{n}.{pn}': grad(nm, g)))
    return handles

def train(model, batches):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb in batches:
        F.cross_entropy(model(xb), yb).backward()
        opt.step(); opt.zero_grad()

def gated(f):
    def _f(*args, **kwargs):
        if GATE['miniai']: return f(*args, **kwargs)
    return _f

def instrument_saving_hook():
    "Time (and gate) `SavingHook`'s hook methods; the hooks bind them when they are registered, so this comes first."
    from miniai.dumps import SavingHook
    if not hasattr(SavingHook, '_timed'):
        SavingHook._save_output, SavingHook._save_grad = (gated(timed(SavingHook._save_output)), gated(timed(SavingHook._save_grad)))
        SavingHook._timed = True
    return SavingHook

def time_mode(mode, batches, tmp, limits=(-1, -1)):
    from miniai.learner import baseline_cnn
    SavingHook = instrument_saving_hook()
    torch.manual_seed(0)
    model = baseline_cnn()
    path = Path(tempfile.mkdtemp(dir=tmp))
    handles, hook = [], None
    if mode == 'seed': handles = seed_style_hooks(model, path, 'Conv2d', *limits)
    elif mode == 'miniai':
        hook = SavingHook(model, path, 'Conv2d', max_saved_tensors=limits[0], max_saved_grads=limits[1])
    IN_HOOKS.reset()
    t0, c0 = clock(), time.process_time()
    train(model, batches)
    t_loop = clock() - t0
    if hook is not None: hook.remove()      # waits for the writer thread
    t_all, cpu = clock() - t0, time.process_time() - c0
    for h in handles: h.remove()
    n_bytes = sum(f.stat().st_size for f in path.rglob('*.npy'))
    shutil.rmtree(path)
    return t_loop, t_all, cpu, IN_HOOKS.seconds, n_bytes

def bench_saving(args, tmp, limits=(-1, -1)):
    torch.manual_seed(1)
    batches = [(torch.rand(args.bs, 1, 28, 28), torch.randint(0, 10, (args.bs,))) for _ in range(args.steps)]
    time_mode('none', batches[:2], tmp)   # warm-up
    res = {m: [] for m in ('none', 'seed', 'miniai')}
    for _ in range(args.repeats):
        for m in res: res[m].append(time_mode(m, batches, tmp, limits))
    # the minimum over interleaved repeats: the run least disturbed by other processes
    best = {m: tuple(min(r[i] for r in v) for i in range(4)) + (v[0][4],) for m, v in res.items()}
    base, base_cpu = best['none'][0], best['none'][2]
    added_seed = best['seed'][0] - base
    added_loop, added_all = best['miniai'][0] - base, best['miniai'][1] - base
    what = ("every step: 5 Conv2d outputs + 10 parameter grads" if limits[0] < 0 else
            f"the first {limits[0]} Conv2d outputs and {limits[1]} parameter grads (the default limits), then training goes on")
    print(f"## saving: baseline_cnn, bs={args.bs}, {args.steps} steps, {what} "
          f"({best['miniai'][4]/2**20:.0f} MB written), best of {args.repeats} interleaved runs, torch threads={torch.get_num_threads()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"{'':30}{'wall s':>9}{'added':>9}{'in hooks':>10}{'CPU s (all threads)':>21}")
    print(f"{'no hooks':30}{base:9.3f}{'':9}{'':10}{base_cpu:21.3f}")
    print(f"{'np.save in the hook':30}{best['seed'][0]:9.3f}{added_seed:+9.3f}{best['seed'][3]:10.3f}{best['seed'][2]:21.3f}")
    print(f"{'miniai, training loop':30}{best['miniai'][0]:9.3f}{added_loop:+9.3f}{best['miniai'][3]:10.3f}")
    print(f"{'miniai, loop + final flush':30}{best['miniai'][1]:9.3f}{added_all:+9.3f}{'':10}{best['miniai'][2]:21.3f}")
    def ratio(a, b): return f'{a/b:.1f}x' if b > 0 else f'miniai added nothing measurable ({b*1e3:+.0f} ms)'
    print(f"best of {args.repeats}: added wall time, seed / miniai: {ratio(added_seed, added_loop)} (training loop), "
          f"{ratio(added_seed, added_all)} (including the final flush); "
          f"time in hooks, seed / miniai: {best['seed'][3]/max(best['miniai'][3], 1e-9):.1f}x")
    # the same from each repeat's own no-hook run (interleaved, so both saw the same phase of the machine): medians
    med = lambda v: float(np.median(v))
    d_seed = med([s[0] - n[0] for s, n in zip(res['seed'], res['none'])])
    d_loop = med([m[0] - n[0] for m, n in zip(res['miniai'], res['none'])])
    d_all = med([m[1] - n[0] for m, n in zip(res['miniai'], res['none'])])
    print(f"median of {args.repeats} paired differences: added wall s, seed {d_seed:+.3f}, miniai {d_loop:+.3f} (loop), {d_all:+.3f} (+ flush); "
          f"seed / miniai: {ratio(d_seed, d_loop)} (training loop), {ratio(d_seed, d_all)} (including the final flush)")
    return d_seed, d_all

def create_cost(folder, n=40):
    "Microseconds to create an empty file in `folder` (on ext4 it varies with the folder's block group)."
    t0 = clock()
    for i in range(n): os.close(os.open(folder/f'probe_{i}', os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    dt = (clock() - t0) / n
    for i in range(n): os.unlink(folder/f'probe_{i}')
    return dt * 1e6

def bench_interleaved(args, tmp, limits=(-1, -1)):
    """Both writers on the training thread (no spare core): ONE training run whose steps take turns, without saving, with
    np.save in the hook and with miniai (its default `background=None`, which with no spare core writes in the hook), in a shuffled order in each cycle of three steps. Both see
    the same disk, page cache, writeback and machine load, so the paired step differences are far less noisy than
    whole runs compared with each other. miniai's final flush (its index.json files) is added to its total."""
    from miniai.learner import baseline_cnn
    SavingHook = instrument_saving_hook()
    torch.manual_seed(1)
    batches = [(torch.rand(args.bs, 1, 28, 28), torch.randint(0, 10, (args.bs,))) for _ in range(8)]
    torch.manual_seed(0)
    model, root = baseline_cnn(), Path(tempfile.mkdtemp(dir=tmp))
    handles = seed_style_hooks(model, root/'seed', 'Conv2d', *limits)
    hook = SavingHook(model, root/'miniai', 'Conv2d', max_saved_tensors=limits[0], max_saved_grads=limits[1], background=None)
    if not hook.writer.sync_cpu: sys.exit("--interleaved compares writers on the training thread: run it with no spare core (torch threads = cores)")
    costs = {m: create_cost(root/m/'tensors'/'rank_0') for m in ('seed', 'miniai')}
    opt, rng = torch.optim.SGD(model.parameters(), lr=0.1), np.random.default_rng(0)
    modes, times = ('none', 'seed', 'miniai'), {m: [] for m in ('none', 'seed', 'miniai')}
    last = 0   # the last cycle with writes: both writers have the same limits and each saves once per cycle, so miniai's counts tell
    for c in range(args.steps):
        before = hook.n_tensors, hook.n_grads
        xb, yb = batches[c % len(batches)]
        for m in rng.permutation(modes):
            GATE.update(seed=m == 'seed', miniai=m == 'miniai')
            t0 = clock()
            F.cross_entropy(model(xb), yb).backward()
            opt.step(); opt.zero_grad()
            times[m].append(clock() - t0)
        if (hook.n_tensors, hook.n_grads) != before: last = c
    GATE.update(seed=True, miniai=True)
    t0 = clock(); hook.remove(); t_flush = clock() - t0
    for h in handles: h.remove()
    n_bytes = {m: sum(f.stat().st_size for f in (root/m).rglob('*.npy')) for m in ('seed', 'miniai')}
    shutil.rmtree(root)
    window = min(args.steps, last + 3)   # the cycles with writes and two after them; later ones add only noise
    t = {m: np.array(v[:window]) for m, v in times.items()}
    d = {m: t[m] - t['none'] for m in ('seed', 'miniai')}
    tot = {m: d[m].sum() for m in d}
    tot['miniai'] += t_flush
    se = {m: d[m].std(ddof=1) * np.sqrt(len(d[m])) for m in d}   # standard error of the summed differences
    what = "every step" if limits[0] < 0 else f"default limits ({limits[0]} outputs, {limits[1]} grads)"
    print(f"## interleaved steps, no spare core: {args.steps} cycles of (none, np.save, miniai) in shuffled order, {what}, "
          f"{n_bytes['miniai']/2**20:.0f} MB each, torch threads={torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}; "
          f"an empty file's creation here: {costs['seed']:.0f} us (np.save's folder), {costs['miniai']:.0f} us (miniai's)")
    print(f"no saving: {t['none'].sum():.3f} s over the {window} cycles with writes (and two after them; median step {np.median(t['none'])*1e3:.2f} ms)")
    for m, label in (('seed', 'np.save in the hook'), ('miniai', 'miniai, + final flush')):
        print(f"{label:24} added {tot[m]:+.3f} s +- {2*se[m]:.3f} (2 SE); median step difference {np.median(d[m])*1e3:+.2f} ms")
    print(f"miniai's final flush: {t_flush*1e3:.1f} ms; np.save / miniai, added time: {tot['seed']/tot['miniai']:.2f}x")
    return tot['seed'], tot['miniai']

def write_dumps(root, total_mb, file_mb=16, dtype='float32'):
    n_files = max(1, total_mb // (2*file_mb))
    n = file_mb * 2**20 // np.dtype(dtype).itemsize
    rng = np.random.default_rng(0)
    for run in ('A', 'B'):
        d = root/run/'tensors'/'rank_0'; d.mkdir(parents=True)
    for i in range(n_files):
        a = rng.standard_normal(n).astype(dtype)
        np.save(root/'A'/'tensors'/'rank_0'/f'tensor_idx_{i}_layer_class_X_layer_name_l{i}_micro_step_0.npy', a)
        a += (1e-3 * rng.standard_normal(n)).astype(dtype)
        np.save(root/'B'/'tensors'/'rank_0'/f'tensor_idx_{i}_layer_class_X_layer_name_l{i}_micro_step_0.npy', a)
    return n_files

def compare_only(root):
    "Run in a fresh process: time compare_dumps and report its peak resident memory."
    from miniai.compare import compare_dumps
    def status(key):   # kB in /proc/self/status
        return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith(key + ':'))
    try: Path('/proc/self/clear_refs').write_text('5')   # reset the peak (VmHWM) to the current RSS
    except OSError: pass
    rss0 = status('VmRSS')
    t0 = clock()
    res = compare_dumps(Path(root)/'A', Path(root)/'B', progress=False, verbose=False)
    dt = clock() - t0
    print(json.dumps(dict(seconds=dt, rows=sum(len(v['compared']) for v in res.values()), rss_before_mb=rss0/1024, rss_peak_mb=status('VmHWM')/1024)))

def bench_compare(args, tmp):
    root = Path(tempfile.mkdtemp(dir=tmp))
    n_files = write_dumps(root, args.compare_mb, dtype=args.compare_dtype)
    total = sum(f.stat().st_size for f in root.rglob('*.npy'))
    files = sorted(root.rglob('*.npy'))
    t0 = clock()
    for f in files: np.load(f, allow_pickle=False).sum()
    t_read = clock() - t0
    out = subprocess.run([sys.executable, __file__, '--compare-only', str(root)], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"## comparing: {2*n_files} files, {total/2**20:.0f} MB in all ({args.compare_dtype}, page cache warm), {os.cpu_count()} cores")
    print(f"read every file once (np.load + sum): {t_read:6.2f} s  ({total/2**20/t_read:.0f} MB/s)")
    print(f"compare_dumps (float64 stats):        {r['seconds']:6.2f} s  ({total/2**20/r['seconds']:.0f} MB/s), "
          f"{r['seconds']/t_read:.1f}x the read-once time, {r['rows']} rows")
    print(f"comparing process: peak RSS {r['rss_peak_mb']:.0f} MB, {r['rss_peak_mb'] - r['rss_before_mb']:.0f} MB above its RSS "
          f"after imports ({r['rss_before_mb']:.0f} MB); mmap'd file pages count in RSS while they are read")
    shutil.rmtree(root)

if __name__ == '__main__':
    p = argparse.ArgumentParser()
    p.add_argument('--steps', type=int, default=30)
    p.add_argument('--bs', type=int, default=256)
    p.add_argument('--repeats', type=int, default=7)
    p.add_argument('--compare-mb', type=int, default=1024)
    p.add_argument('--compare-dtype', default='float32', choices=['float32', 'float64'])
    p.add_argument('--threads', type=int, default=None, help='torch intra-op threads for the saving bench (default: torch default)')
    p.add_argument('--skip-saving', action='store_true')
    p.add_argument('--interleaved', action='store_true', help='no spare core: one run, steps taking turns (see bench_interleaved)')
    p.add_argument('--limits-only', action='store_true', help='only the run with the default limits')
    p.add_argument('--goals', action='store_true', help='both saving goals in one run: --interleaved with every core busy, then whole runs with a free core')
    p.add_argument('--skip-compare', action='store_true')
    p.add_argument('--compare-only', default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.compare_only: compare_only(args.compare_only); sys.exit(0)
    if args.threads: torch.set_num_threads(args.threads)
    tmp = tempfile.mkdtemp(prefix='bench_dumps_')
    try:
        if args.goals:   # both saving goals (no spare core, a free core), in one run
            cores = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()
            torch.set_num_threads(cores)
            busy = [bench_interleaved(args, tmp), bench_interleaved(args, tmp, limits=(50, 100))]
            torch.set_num_threads(max(1, cores - 1))
            free = [bench_saving(args, tmp), bench_saving(args, tmp, limits=(50, 100))]
            print(f"## goals: np.save's added training time / miniai's, every step; default limits")
            print(f"no spare core ({cores} torch threads, interleaved steps, goal >= 1): "
                  + '; '.join(f'{a/b:.2f}x' for a, b in busy))
            print(f"a free core ({max(1, cores - 1)} torch threads, whole runs, median of paired differences with the final flush, goal >= 2): "
                  + '; '.join(f'{a/b:.2f}x' for a, b in free))
        elif args.interleaved:
            if not args.limits_only: bench_interleaved(args, tmp)
            bench_interleaved(args, tmp, limits=(50, 100))
        elif not args.skip_saving:
            if not args.limits_only: bench_saving(args, tmp)
            bench_saving(args, tmp, limits=(50, 100))
        if not args.skip_compare: bench_compare(args, tmp)
    finally: shutil.rmtree(tmp, ignore_errors=True)
