"""Overhead of run-wide activation statistics (lesson 10a) on one training epoch of the lesson's baseline CNN.

Every configuration trains a fresh `baseline_cnn()` for one epoch of `fashion_dls(1024)` (59 training batches, plain
SGD at lr 0.6, no validation), with hooks on the model's five `nn.Conv2d`, recording every batch; the statistics are read
once at the end (`get_all_statistics()`, or `hook.stats` for ActivationStats) and that read is timed with the epoch.
Rounds are interleaved: each round runs every configuration once, in a new random order, and each configuration's
time is divided by the same round's no-hook time; the table gives the median of those ratios and their quartiles.

Usage (repo root):  .venv/bin/python bench/bench_statistics.py --rounds 7
                    .venv/bin/python bench/bench_statistics.py --micro      # per-tensor costs of the kernel's pieces
                    .venv/bin/python bench/bench_statistics.py --paired 3   # one run, steps taking turns (the steadiest)
"""
import argparse, json, random, statistics, time, warnings
from types import SimpleNamespace
import torch, torch.nn.functional as F
from torch import nn
from miniai.datasets import fashion_dls
from miniai.learner import Learner, TrainCB, baseline_cnn, set_seed
from miniai.activations import ActivationStats
from miniai.statistics import StatisticsConfig, ActivationStatisticsHook

CONFIGS = {
    'no hooks': None,
    'ActivationStats (lesson 10)': 'astats',
    'StatisticsConfig(collect_input=False): mean/std/min/max, p95/p99': StatisticsConfig(collect_input=False),
    'moments only (collect_percentiles=[], max_samples=None)': StatisticsConfig(collect_input=False, collect_percentiles=[], max_samples=None),
    'StatisticsConfig() (inputs too)': StatisticsConfig(),
    'StatisticsConfig(collect_input=False, collect_sparsity=True)': StatisticsConfig(collect_input=False, collect_sparsity=True),
    'StatisticsConfig(collect_input=False, exact=True): float64, every value': StatisticsConfig(collect_input=False, exact=True),
}



_last_read = [0.]            # seconds the last run_epoch spent reading the statistics after fit
from _timing import clock, Inside   # the bench scripts' one timing helper; --clock cpu: time.process_time, the CPU time of this process (all its threads)

def run_epoch(dls, spec):
    "Seconds for one training epoch with `spec`'s hooks, including one read of the statistics at the end."
    set_seed(1)
    model = baseline_cnn()
    cbs = [TrainCB()]
    if spec == 'astats': cbs.append(astats := ActivationStats(nn.Conv2d))
    learn = Learner(model, dls, loss_func=F.cross_entropy, lr=0.6, cbs=cbs)
    hooks = None
    if isinstance(spec, StatisticsConfig):
        hook = ActivationStatisticsHook(spec)
        hooks = hook.attach(model, nn.Conv2d)
    t0 = clock()
    learn.fit(1, valid=False)
    t1 = clock()
    if isinstance(spec, StatisticsConfig): hook.get_all_statistics()
    elif spec == 'astats':
        for h in astats.hooks: h.stats[0]   # indexing reads: the last flush and the per-batch moments
    dt = clock() - t0
    _last_read[0] = clock() - t1
    if hooks is not None: hooks.remove()
    return dt


_inside = Inside(lambda: clock())   # this script's clock, which --clock cpu changes
_timed = _inside.wrap

def run_inside(dls, spec):
    "`(time in the hooks and the final read, the rest of the epoch)`: the hook functions themselves are timed."
    import miniai.activations as A, miniai.statistics as S
    orig = A.ActivationStats.hook, S.StatisticsCollector.update_statistics   # ActivationStats records in its `hook` method
    A.ActivationStats.hook, S.StatisticsCollector.update_statistics = _timed(orig[0]), _timed(orig[1])
    try:
        _inside.reset()
        dt = run_epoch(dls, spec)   # includes the final read, which is not in the hook functions
        return dt, _inside.seconds + _last_read[0]
    finally: A.ActivationStats.hook, S.StatisticsCollector.update_statistics = orig


def main_inside(rounds, names):
    """The hooks' own cost: time spent inside the hook functions plus the final read of the statistics, as a share of the
    rest of the same epoch. Unlike whole-epoch ratios this does not depend on the machine's speed drifting between
    epochs; it leaves out PyTorch's own cost of calling a forward hook and any cache effect on the training's ops."""
    dls = fashion_dls(1024)
    names = [k for k in names if CONFIGS[k] is not None]
    for k in names: run_inside(dls, CONFIGS[k])
    shares, rng = {k: [] for k in names}, random.Random(0)
    for r in range(rounds):
        order = names[:]; rng.shuffle(order)
        for k in order:
            dt, inside = run_inside(dls, CONFIGS[k])
            shares[k].append(inside / (dt - inside))
        print(f'round {r}: ' + ', '.join(f'{shares[k][-1]*100:.2f}%' for k in names), flush=True)
    print(f'\ntorch {torch.__version__}, {torch.get_num_threads()} threads, {len(dls.train)} training batches per epoch, {rounds} rounds')
    print('| configuration (hooks on the five convolutions) | time in the hooks, share of the rest of the epoch (median) | min-max |')
    print('|---|---|---|')
    for k in names: print(f'| {k} | {statistics.median(shares[k])*100:.2f}% | {min(shares[k])*100:.2f}-{max(shares[k])*100:.2f}% |')


def _new_forward_hooks(model, register):
    "Call `register()`; returns the forward hooks it added, as `(module, key, hook)`, so that they can be switched off and on."
    before = {id(m): set(m._forward_hooks) for m in model.modules()}
    out = register()
    added = [(m, k, h) for m in model.modules() for k, h in m._forward_hooks.items() if k not in before[id(m)]]
    return added, out

def _switch(hooks, on):
    "Put the hooks into their modules' forward-hook dicts, or take them out: a module with none takes PyTorch's fast path."
    for m, k, h in hooks:
        if on: m._forward_hooks[k] = h
        else: m._forward_hooks.pop(k, None)


def main_paired(epochs, names):
    """ONE training run whose steps take turns: in each cycle, the same batch is trained once per configuration, in a
    new random order, with only that configuration's hooks in the model's hook dicts (the others are taken out, so a
    step without hooks is PyTorch's plain path). Each configuration's cost is the sum of its steps minus the same
    cycles' steps without hooks, plus its final read of the statistics once per epoch; the ratio divides by the steps
    without hooks. Slow drifts of the machine's speed hit every configuration alike, which whole epochs compared with
    each other cannot promise. Batches are loaded before timing, so the denominator has no data loading in it and the
    ratios are, if anything, higher than an epoch's."""
    set_seed(1)
    dls = fashion_dls(1024)
    batches = list(dls.train)
    model = baseline_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.6)
    names = [k for k in names if CONFIGS[k] is not None]
    hooks, readers = {}, {}
    for k in names:
        spec = CONFIGS[k]
        if spec == 'astats':
            cb = ActivationStats(nn.Conv2d)
            def reg(cb=cb):
                cb.before_fit(SimpleNamespace(model=model)); cb._training = True
                return cb
            hooks[k], cb = _new_forward_hooks(model, reg)
            readers[k] = lambda cb=cb: [h.stats[0] for h in cb.hooks]
        else:
            hook = ActivationStatisticsHook(spec)
            hooks[k], _ = _new_forward_hooks(model, lambda hook=hook: hook.attach(model, nn.Conv2d))
            readers[k] = hook.get_all_statistics
        _switch(hooks[k], False)
    order, rng = ['no hooks'] + names, random.Random(0)
    times = {k: [] for k in order}
    def step(xb, yb):
        F.cross_entropy(model(xb), yb).backward()
        opt.step(); opt.zero_grad()
    for xb, yb in batches[:3]: step(xb, yb)   # warm-up: the allocator, the CPU loop's compilation, the sample tables
    for k in names:
        _switch(hooks[k], True)
        for xb, yb in batches[:2]: step(xb, yb)
        _switch(hooks[k], False)
    for e in range(epochs):
        for xb, yb in batches:
            rng.shuffle(order)
            for k in order:
                if k != 'no hooks': _switch(hooks[k], True)
                t0 = clock(); step(xb, yb); times[k].append(clock() - t0)
                if k != 'no hooks': _switch(hooks[k], False)
    reads = {}
    for k in names:
        t0 = clock(); readers[k](); reads[k] = clock() - t0
    base = sum(times['no hooks'])
    print(f'torch {torch.__version__}, {torch.get_num_threads()} threads, {epochs} epoch(s) of {len(batches)} batches, each trained '
          f'once per configuration in shuffled order; no-hook steps: {base:.2f} s in all, median {statistics.median(times["no hooks"])*1e3:.1f} ms')
    print('| configuration (hooks on the five convolutions) | added per step, median (ms) | ratio to the steps without hooks, with one read per epoch | +- 2 SE |', flush=True)
    print('|---|---|---|---|')
    for k in names:
        d = [a - b for a, b in zip(times[k], times['no hooks'])]
        se = statistics.stdev(d) * len(d) ** 0.5 / base
        print(f'| {k} | {statistics.median(d)*1e3:.2f} | {(base + sum(d) + reads[k]*epochs) / base:.3f}x | {2*se:.3f} |', flush=True)
    print(json.dumps({k: [round(t * 1e3, 2) for t in v] for k, v in times.items()}))


def quartiles(v): q = statistics.quantiles(v, n=4); return q[0], q[2]


def main_epochs(rounds, names):
    dls = fashion_dls(1024)
    for k in names: run_epoch(dls, CONFIGS[k])      # warm-up: scratch buffers, sample tables, allocator
    times, rng = {k: [] for k in names}, random.Random(0)
    for r in range(rounds):
        order = names[:]; rng.shuffle(order)
        for k in order: times[k].append(run_epoch(dls, CONFIGS[k]))
        print(f'round {r}: ' + ', '.join(f'{times[k][-1]:.2f}' for k in names), flush=True)
    ratios = {k: [t / n for t, n in zip(times[k], times['no hooks'])] for k in names}
    print(f'\ntorch {torch.__version__}, {torch.get_num_threads()} threads, {len(dls.train)} training batches per epoch, '
          f'{rounds} interleaved rounds')
    # two estimators: the median of the per-round ratios, and the ratio of the best (shortest) epochs, which interference
    # from other work on the machine can only lengthen, so that the best of several rounds is the least disturbed one
    print('| configuration (hooks on the five convolutions) | median epoch (s) | vs no hooks (median ratio) | quartiles | best epoch (s) | vs no hooks (best / best) |')
    print('|---|---|---|---|---|---|')
    best0 = min(times['no hooks'])
    for k in names:
        lo, hi = quartiles(ratios[k]) if rounds > 1 else (ratios[k][0],) * 2
        print(f'| {k} | {statistics.median(times[k]):.2f} | {statistics.median(ratios[k]):.3f}x | {lo:.3f}-{hi:.3f} | '
              f'{min(times[k]):.2f} | {min(times[k]) / best0:.3f}x |')
    print(json.dumps({k: [round(t, 3) for t in v] for k, v in times.items()}))


def micro(reps=15):
    "Cost of the kernel's pieces on one tensor (the first convolution's output, 1.6M float32 values), in ms."
    from miniai.kernel import batch_moments, use_kernel, Recorder, sample_table, SAMPLE_RUN, sample_bins
    from miniai.sketch import QuantileSketch, SketchRecorder
    def torch_ops(x):
        with use_kernel('torch'): return batch_moments(x)
    batch_moments(torch.ones(10)); sample_bins(torch.ones(10))   # compile the CPU loops before timing them
    n = 1024 * 8 * 14 * 14
    idx = sample_table(n, 16384, 'cpu', SAMPLE_RUN)[0]
    cases = {'x.clone() (one read + one write)': lambda x: x.clone(), 'x.sum() (one read)': lambda x: x.sum(),
             'batch_moments(x, zeros=False): every number, CPU loops': lambda x: batch_moments(x, zeros=False),
             'batch_moments(x): and the zero count': lambda x: batch_moments(x),
             'the same with torch ops (what a GPU runs)': torch_ops,
             'sample_bins: the 16K-value histogram sample': lambda x: sample_bins(x, idx=idx, run=SAMPLE_RUN),
             'Recorder.record (lesson 10: the two above)': None,
             'SketchRecorder().record (run-wide: folded moments, sketch flush amortised)': None,
             'QuantileSketch.batch_counts(x) (exact=True)': lambda x: QuantileSketch.batch_counts(x)}
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, generator=g) for _ in range(16)]   # 103 MB: each read comes from memory, as in training
    times = {k: [] for k in cases}
    for _ in range(reps):
        for k, f in cases.items():
            if f is None:
                rec = Recorder() if 'lesson 10' in k else SketchRecorder()
                t0 = clock()
                for x in xs: rec.record(x)
                if rec.fold: rec.flush()
                times[k].append((clock() - t0) / len(xs))
            else:
                t0 = clock()
                for x in xs: f(x)
                times[k].append((clock() - t0) / len(xs))
    print(f'torch threads: {torch.get_num_threads()}')
    print('| per tensor (1,605,632 float32) | median ms |\n|---|---|')
    for k, v in times.items(): print(f'| {k} | {statistics.median(v)*1000:.3f} |')


if __name__ == '__main__':
    p = argparse.ArgumentParser()
    p.add_argument('--rounds', type=int, default=7)
    p.add_argument('--micro', action='store_true', help='only the per-tensor cost table')
    p.add_argument('--inside', action='store_true', help='the time spent inside the hooks, as a share of the rest of the epoch')
    p.add_argument('--paired', type=int, default=0, metavar='EPOCHS', help='one training run whose steps take turns between the configurations (see main_paired)')
    p.add_argument('--configs', default=None, help='comma-separated indices into CONFIGS (default: all); 0 is always run')
    p.add_argument('--clock', choices=['wall', 'cpu'], default='wall',
                   help="wall: elapsed time; cpu: this process's CPU time, which a VM's stolen time and other jobs disturb less")
    args = p.parse_args()
    if args.clock == 'cpu': clock = time.process_time
    names = list(CONFIGS)
    if args.configs: names = [names[0]] + [names[int(i)] for i in args.configs.split(',') if int(i)]
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        if args.micro: micro()
        elif args.inside: main_inside(args.rounds, names)
        elif args.paired: main_paired(args.paired, names)
        else: main_epochs(args.rounds, names)
