"""What the hooks cost: per call as a multiple of one read of the same tensors (a figure that carries from one machine to
the next), and on the user's clock, a whole `fit(1)` of the lesson-10 baseline (wall clock, torch's default threads).

Per call (`--rounds`, default 20): forwards of `baseline_cnn()` (train mode, no grad) on one FashionMNIST batch of 1024,
with each configuration's hooks on the five convolutions, in shuffled interleaved rounds; what a configuration adds to a
forward is its time minus the same round's no-hook forward (median over rounds), and its multiple of the floor is that
divided by what one read adds: `outp.sum()` of the same outputs (`ActivationStats`, the course's hooks), or of the same
inputs and outputs (the collector, which records both).

Whole fit (`--fit-rounds`, default 5): a fresh model trained for one epoch (59 training, 10 validation batches), statistics
read once at the end, each configuration once per round in a new random order; each time divided by the same round's
no-hook time (median and quartiles over rounds).

Configurations:
  one read (floor)  a hook that reads each output once (`outp.sum()`); `one read in+out`: each input and output
  ActivationStats   lesson 10: exact counts, mean, std, dead/overflow fractions and a sampled |x| histogram per batch
                    (per call: its recorders, `Recorder(minmax=False)`, what its hook runs for each output)
  StatisticsConfig  the collector with the default config (mean, std, min/max, p95/p99) on inputs and outputs
  course hooks      the course's `append_stats` (to_cpu, mean, std, histc of |x|)

--baseline DIR: DIR holds another copy of the package (`DIR/miniai`, e.g. `git archive HEAD miniai | tar -x -C DIR`): its
                ActivationStats and StatisticsConfig hooks run in the same shuffled rounds, as "... (baseline)", so that
                a before/after comparison shares the machine's state (per call only).
--clock cpu: time each call by the CPU time of this thread (`time.thread_time`), with one torch thread (set `--threads`
              too, or it is 1): on a machine that other jobs load, wall-clock rounds vary several-fold, CPU time much less.
--ops: torch ops per hook call on the torch path (`use_kernel('torch')`), counted with `count_ops`.
--cold [N]: N rounds (default 5) of fresh processes, each with an empty numba cache (`NUMBA_CACHE_DIR`), then one with that
             cache warm: each makes `ActivationStats` (then, in N more, the default collector) and trains 12 steps of batch 1024;
             when the loops were ready (seconds from the process's start), its first hooked step and when it ended, and the 11
             after it against a plain step (timed after the hooked ones, hooks removed). With --baseline, the other copy's processes run in the same rounds.

Usage (repo root): .venv/bin/python bench/bench_wallclock.py [--rounds 20] [--fit-rounds 5] [--ops] [--cold] [--baseline DIR]
"""
import argparse, importlib, importlib.util, json, os, statistics, subprocess, sys, tempfile, warnings
from pathlib import Path
import time, torch, torch.nn.functional as F
import _timing
from torch import nn
from _timing import cpu_name, interleaved, quartiles, ratios, once, clock, one_read, one_read_io
from miniai.datasets import fashion_dls
from miniai.learner import Learner, TrainCB, baseline_cnn, set_seed
from miniai.hooks import Hooks, HooksCallback
import miniai.activations as A
import miniai.statistics as S
from miniai.kernel import Recorder, use_kernel
from miniai.testing import count_ops
from bench_activations import course_stats   # the course's append_stats, as the other benches run it

def recorders(model, Rec=None):
    "What ActivationStats' hook runs per output: one `Recorder(minmax=False)` per conv."
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    recs = [(Rec or Recorder)(minmax=False, seed=i) for i in range(len(convs))]
    return [m.register_forward_hook(lambda mod, i, o, r=r: r.record(o)) for m, r in zip(convs, recs)]

def collector(model, config=None, mod=None):
    "The collector as a forward hook on every Conv2d, named by `_hook_name` (inputs and outputs)."
    mod = mod or S
    hook = mod.ActivationStatisticsHook(config or mod.StatisticsConfig())
    handles = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            m._hook_name = name
            handles.append(m.register_forward_hook(hook))
    return hook, handles

def convs(model): return [m for m in model.modules() if isinstance(m, nn.Conv2d)]

PER_CALL = ['no hooks', 'one read (floor)', 'one read in+out', 'ActivationStats', 'StatisticsConfig', 'course hooks']

def load_baseline(folder):
    "The `kernel` and `statistics` modules of the copy of the package in `folder/miniai`, imported as `miniai_baseline`, its compiled loops ready."
    pkg = os.path.join(os.path.abspath(folder), 'miniai')
    spec = importlib.util.spec_from_file_location('miniai_baseline', os.path.join(pkg, '__init__.py'), submodule_search_locations=[pkg])
    mod = importlib.util.module_from_spec(spec); sys.modules['miniai_baseline'] = mod; spec.loader.exec_module(mod)
    K, BS = importlib.import_module('miniai_baseline.kernel'), importlib.import_module('miniai_baseline.statistics')
    with (K.use_kernel('loops') if hasattr(K, 'use_kernel') else K.fused_kernel(True)): K.Recorder().record(torch.ones(100))
    return K, BS

def per_call(x, rounds, baseline=None):
    "Seconds per forward with each configuration's hooks (lists over rounds)."
    set_seed(1)
    model = baseline_cnn().train()
    def fwd(attach):
        def f():
            handles = attach()
            try:
                with torch.no_grad(): model(x)
            finally:
                for h in handles: h.remove()
        return f
    fns = {'no hooks': fwd(lambda: []),
           'one read (floor)': fwd(lambda: Hooks(convs(model), one_read)),
           'one read in+out': fwd(lambda: Hooks(convs(model), one_read_io)),
           'ActivationStats': fwd(lambda: recorders(model)),
           'StatisticsConfig': fwd(lambda: collector(model)[1]),
           'course hooks': fwd(lambda: Hooks(convs(model), course_stats))}
    if baseline:
        K, BS = baseline
        fns['ActivationStats (baseline)'] = fwd(lambda: recorders(model, K.Recorder))
        fns['StatisticsConfig (baseline)'] = fwd(lambda: collector(model, mod=BS)[1])
    interleaved(fns, 3, reps=2)                       # warm up: compile the loops, fill caches
    return interleaved(fns, rounds, reps=3)

FIT = ['no hooks', 'one read (floor)', 'one read in+out', 'ActivationStats', 'StatisticsConfig', 'course hooks']
FIT_FLOOR = {'ActivationStats': 'one read (floor)', 'course hooks': 'one read (floor)', 'StatisticsConfig': 'one read in+out'}

def fit_once(dls, name):
    set_seed(1)
    model = baseline_cnn()
    cbs, handles, hook, astats = [TrainCB()], [], None, None
    if name == 'ActivationStats': cbs.append(astats := A.ActivationStats(nn.Conv2d))
    elif name == 'course hooks': cbs.append(HooksCallback(course_stats, nn.Conv2d))
    elif name == 'one read (floor)': cbs.append(HooksCallback(one_read, nn.Conv2d))
    elif name == 'one read in+out': cbs.append(HooksCallback(one_read_io, nn.Conv2d, on_valid=True))   # the collector records every call
    elif name == 'StatisticsConfig': hook, handles = collector(model)
    learn = Learner(model, dls, loss_func=F.cross_entropy, lr=0.6, cbs=cbs)
    t0 = clock()
    learn.fit(1)
    if hook is not None: hook.get_all_statistics()
    if astats is not None: [h.stats[1] for h in astats.hooks]
    dt = clock() - t0
    for h in handles: h.remove()
    return dt

def ops_per_call(x):
    "Torch ops per hook call on the torch path: ActivationStats' recorders and the collector (its kernel share and the rest)."
    res = {}
    for name in ('ActivationStats', 'StatisticsConfig'):
        set_seed(1)
        model = baseline_cnn()
        with use_kernel('torch'), torch.no_grad():
            model(x)
            with count_ops() as plain: model(x)
            handles = recorders(model) if name == 'ActivationStats' else collector(model)[1]
            for _ in range(3): model(x)     # warm: the streams made, the exact first buffers released, the sample tables drawn (once each)
            with count_ops() as hooked: model(x)
            for h in handles: h.remove()
        res[name] = (hooked.n - plain.n) / len(handles)
    return res

COLD = """
import sys, time, json, statistics, threading, torch, torch.nn.functional as F
t_import = time.time()
from _timing import clock
from torch import nn
from miniai.learner import baseline_cnn, set_seed
from miniai.activations import ActivationStats
from miniai.statistics import ActivationStatisticsHook
import miniai.kernel as K
t0, what, steps = float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
def ready():
    "Whether the loops are ready, read without starting anything (`loops_ready` would start them): the loaded loops' dict of this tree's passes, or of an older tree's kernel."
    P = sys.modules.get('miniai.passes')
    return 'record' in (P._LOOPS if P is not None else K._LOOPS)
seen = {}
def watch():
    while 'ready' not in seen:
        if ready(): seen['ready'] = time.time() - t0
        time.sleep(0.005)
threading.Thread(target=watch, daemon=True).start()
set_seed(1); model = baseline_cnn(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(1024, 1, 28, 28), torch.randint(0, 10, (1024,))
def step():
    t = clock(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step(); opt.zero_grad(); return clock() - t
t = clock(); rec = ActivationStats(nn.Conv2d) if what == 'ActivationStats' else ActivationStatisticsHook(); made = clock() - t   # a cached load happens here
hooked, ready_step = [], -1
with rec.attach(model, nn.Conv2d) if what != 'ActivationStats' else rec.attach(model):
    for i in range(steps):
        hooked.append(step())
        if i == 0: first_done = time.time() - t0
        if ready_step < 0 and 'ready' in seen: ready_step = i
seen.setdefault('ready', -1.)
plain = statistics.median([step() for _ in range(6)][1:])     # the hooks removed: a plain step, afterwards
print(K.__file__)
print(json.dumps(dict(plain=plain, made=made, ready_step=ready_step, ready_s=seen['ready'], first_step_done_s=first_done, imports_s=t_import - t0, hooked=hooked)))
"""

def cold_start(cache, what='ActivationStats', steps=12, package=None):
    "A fresh process (numba cache folder `cache`) that makes `what` ('ActivationStats', or the default collector: 'StatisticsConfig') as a user would and trains `steps` steps, with this tree's package or the copy in `package` (`package/miniai`): a dict of its plain step, the time to make it (first thing after the imports, as a user would), the step and the seconds from the process's start at which the loops were ready (-1: not within the run), when its first hooked step ended, and its hooked steps."
    root = package or str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, 'NUMBA_CACHE_DIR': cache, 'PYTHONPATH': os.pathsep.join([root, str(Path(__file__).resolve().parent), os.environ.get('PYTHONPATH', '')])}
    for k in ('MINIAI_FUSED', 'MINIAI_KERNEL'): env.pop(k, None)
    out = subprocess.run([sys.executable, '-c', COLD, repr(time.time()), what, str(steps)], capture_output=True, text=True, env=env, timeout=1800,
                         cwd=cache)   # not the repo: `python -c` puts the working folder ahead of PYTHONPATH
    if out.returncode: raise RuntimeError(f'the cold-start process failed:\n{out.stderr[-2000:]}')
    path, numbers = out.stdout.strip().split('\n')[-2:]
    if not path.startswith(os.path.join(os.path.abspath(root), 'miniai')): raise RuntimeError(f'the cold-start process imported another miniai: {path}')
    return json.loads(numbers)

def wait_for_cache(cache, timeout=600):
    "Wait until the compiling child of a cold process (it goes on after its parent exits) has written every loop to `cache`: the sketch loop's index there (this tree's `loops.sketch_loop`, an older tree's `kernel._sketch_loop`), and no file changed for 3 s."
    t0, last = time.time(), None
    while time.time() - t0 < timeout:
        files = {os.path.join(r, f): os.path.getmtime(os.path.join(r, f)) for r, _, fs in os.walk(cache) for f in fs}
        if any(('loops.sketch_loop-' in f or 'kernel._sketch_loop-' in f) and f.endswith('.nbi') for f in files) and files == last: return True
        last = files; time.sleep(3)
    return False

def cold_report(n, what, baseline=None, steps=12):
    "`n` rounds, each a fresh process with an empty numba cache then one with that cache warm, for this tree and (`baseline`) another copy of the package, one after the other in each round."
    trees = [('this tree', None)] + ([('baseline', os.path.abspath(baseline))] if baseline else [])
    rows = {name: {'empty': [], 'warm': []} for name, _ in trees}
    for i in range(n):
        for name, pkg in (trees if i % 2 == 0 else trees[::-1]):
            with tempfile.TemporaryDirectory() as d:
                rows[name]['empty'].append(cold_start(d, what, steps, pkg))
                if wait_for_cache(d): rows[name]['warm'].append(cold_start(d, what, steps, pkg))
    med = statistics.median
    print(f"cold start of {what}, {n} rounds ({steps} hooked steps each; seconds from the process's start; steps as a multiple of a plain step):")
    print("| tree | numba cache | loops ready at | first hooked step | it ended at | steps 2-12 (median) | making it |")
    print("|---|---|---|---|---|---|---|")
    for name, _ in trees:
        for kind in ('empty', 'warm'):
            got = rows[name][kind]
            if not got: continue
            ready = [g['ready_s'] for g in got]
            ready_txt = f"{med(r for r in ready if r >= 0):.1f} s" if any(r >= 0 for r in ready) else 'after the run'
            if any(r < 0 for r in ready) and any(r >= 0 for r in ready): ready_txt += f" ({sum(r < 0 for r in ready)} of {len(ready)} after the run)"
            print(f"| {name} | {kind} | {ready_txt} | {med(g['hooked'][0] / g['plain'] for g in got):.2f}x | {med(g['first_step_done_s'] for g in got):.1f} s "
                  f"| {med(v / g['plain'] for g in got for v in g['hooked'][1:]):.2f}x | {med(g['made'] for g in got)*1e3:.0f} ms |")

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rounds', type=int, default=20, help='rounds of the per-call measurement')
    p.add_argument('--fit-rounds', type=int, default=5, help='rounds of whole fit(1)s (0: none)')
    p.add_argument('--ops', action='store_true', help='also count torch ops per hook call on the torch path')
    p.add_argument('--cold', type=int, nargs='?', const=5, default=0, help='also time cold starts: N fresh processes with an empty numba cache, each then with it warm (default 5)')
    p.add_argument('--clock', choices=['wall', 'cpu'], default='wall', help='wall clock, or the CPU time of this thread (one torch thread)')
    p.add_argument('--threads', type=int, help='torch threads (default: torch\'s own; 1 with --clock cpu)')
    p.add_argument('--baseline', help='folder holding another copy of the package (DIR/miniai) to time in the same rounds')
    p.add_argument('--json', help='write the raw timings here')
    args = p.parse_args()
    warnings.filterwarnings('ignore')
    if args.threads or args.clock == 'cpu': torch.set_num_threads(args.threads or 1)
    if args.clock == 'cpu':
        global clock
        clock = _timing.clock = time.thread_time      # what `interleaved` and `fit_once` time with
    dls = fashion_dls(1024)
    x, _ = next(iter(dls.train))
    with use_kernel('loops'): Recorder().record(torch.ones(100))   # the compiled loops ready (compiled or loaded) before any timing
    print(f"CPU: {cpu_name()}; torch {torch.__version__}, {torch.get_num_threads()} threads; {args.clock} clock; load average {os.getloadavg()[0]:.1f} at the start")
    t = per_call(x, args.rounds, load_baseline(args.baseline) if args.baseline else None)
    base = t['no hooks']
    names = [n for n in t if n != 'no hooks']
    added = {n: statistics.median(a - b for a, b in zip(t[n], base)) for n in names}
    floor = {'ActivationStats': 'one read (floor)', 'course hooks': 'one read (floor)', 'StatisticsConfig': 'one read in+out'}
    floor.update({f'{n} (baseline)': floor[n] for n in ('ActivationStats', 'StatisticsConfig')})
    print(f"\nPer forward, {args.rounds} shuffled rounds (no-hook forward {statistics.median(base)*1e3:.2f} ms):")
    print("| what the hooks on five convs add to one forward | ms | multiple of one read |")
    print("|---|---|---|")
    for n in names:
        mult = f"**{added[n] / added[floor[n]]:.1f}x** ({'outputs' if floor[n] == 'one read (floor)' else 'inputs and outputs'})" if n in floor else '1'
        print(f"| {n} | {added[n]*1e3:.3f} | {mult} |")
    res = dict(per_call=t)
    if args.fit_rounds:
        for n in FIT: fit_once(dls, n)          # warm up
        ft = interleaved({n: (lambda n=n: fit_once(dls, n)) for n in FIT}, args.fit_rounds)
        print(f"\nWhole fit(1), {args.fit_rounds} shuffled rounds (no-hook fit {statistics.median(ft['no hooks']):.2f} s):")
        print("| configuration | fit(1) time, median ratio to no hooks (quartiles) |")
        print("|---|---|")
        for n in FIT[1:]:
            m, q1, q3 = quartiles(ratios(ft[n], ft['no hooks']))
            fl = f" (its floor, {FIT_FLOOR[n]}: {statistics.median(ratios(ft[FIT_FLOOR[n]], ft['no hooks'])):.3f}x)" if n in FIT_FLOOR else ''
            print(f"| {n} | **{m:.3f}x** ({q1:.3f}-{q3:.3f}){fl} |")
        res['fit'] = ft
    if args.ops: print('\ntorch ops per hook call on the torch path (use_kernel("torch")):', {k: round(v, 1) for k, v in ops_per_call(x).items()})
    if args.cold:
        for what in ('ActivationStats', 'StatisticsConfig'): print(); cold_report(args.cold, what, args.baseline)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end (other jobs beside this one make every figure noisier)")
    if args.json: json.dump(res, open(args.json, 'w'))

if __name__ == '__main__': main()
