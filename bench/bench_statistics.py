"""Overhead of run-wide activation statistics on one training epoch of the lesson's baseline CNN.

Usage: .venv/bin/python bench/bench_statistics.py [--reps 2] [--batches N]
Each configuration trains a fresh `baseline_cnn()` for one epoch of `fashion_dls(1024)` (training only); configurations
are interleaved and repeated, and the best time of each is compared with the run without hooks.
"""
import argparse, time, warnings
import torch, torch.nn.functional as F
from torch import nn
from miniai.datasets import fashion_dls
from miniai.learner import Learner, TrainCB, DeviceCB, Callback, CancelEpochException, baseline_cnn, set_seed
from miniai.statistics import StatisticsConfig, ActivationStatisticsHook


class LimitCB(Callback):
    "Stop the epoch after `n` batches (None: the whole epoch)."
    def __init__(self, n): self.n = n
    def after_batch(self):
        if self.n and self.learn.iter + 1 >= self.n: raise CancelEpochException()


def leaf(m): return not any(m.children())

CONFIGS = {
    'no hooks': None,
    'blocks, outputs, default config (p95/p99 sketch)': (lambda model: list(model)[:5], StatisticsConfig(collect_input=False)),
    'blocks, outputs, moments only': (lambda model: list(model)[:5], StatisticsConfig(collect_input=False, collect_percentiles=[], max_samples=None)),
    'all leaves, inputs+outputs, default config': (lambda model: leaf, StatisticsConfig()),
    'all leaves, inputs+outputs, update_frequency=10': (lambda model: leaf, StatisticsConfig(update_frequency=10)),
}


def run_epoch(dls, spec, n_batches):
    set_seed(1)
    model = baseline_cnn()
    learn = Learner(model, dls, loss_func=F.cross_entropy, lr=0.6, cbs=[TrainCB(), DeviceCB(), LimitCB(n_batches)])
    hook = None
    if spec is not None:
        pick, cfg = spec
        sel = pick(model)
        hook = ActivationStatisticsHook(cfg)
        names = {m: n for n, m in model.named_modules()}
        handles = hook.attach(model, filter=[names[m] for m in sel] if isinstance(sel, list) else sel)
    t0 = time.perf_counter()
    learn.fit(1, valid=False)
    if hook is not None: hook.get_all_statistics()       # include the one read at the end
    dt = time.perf_counter() - t0
    if hook is not None: handles.remove()
    return dt


def micro(reps=15):
    "Cost of one recorded tensor (the first block's output, 1.6M values) in units of one `x.clone()`: median of `reps`."
    from miniai.activations import moments
    from miniai.statistics import QuantileSketch, StatisticsCollector
    full = StatisticsCollector(StatisticsConfig(collect_input=False))
    mom_only = StatisticsCollector(StatisticsConfig(collect_input=False, collect_percentiles=[], max_samples=None))
    cases = {'x.clone() (one read + one write)': lambda: x.clone(),
             'moments(x, precise=True)': lambda: moments(x, precise=True),
             'QuantileSketch.batch_counts(x)': lambda: QuantileSketch.batch_counts(x),
             'update_statistics, moments only': lambda: mom_only.update_statistics('a', None, x),
             'update_statistics, default config': lambda: full.update_statistics('a', None, x)}
    print(f'torch threads: {torch.get_num_threads()}')
    times = {k: [] for k in cases}
    for _ in range(reps):
        for k, f in cases.items():
            x = torch.randn(1024, 8, 14, 14).relu()      # a new tensor each time (the collector reuses a tensor's batch statistics)
            t0 = time.perf_counter(); f(); times[k].append(time.perf_counter() - t0)
    med = {k: sorted(v)[len(v)//2] for k, v in times.items()}
    base = med['x.clone() (one read + one write)']
    print('| per recorded tensor (1,605,632 float32) | median ms | in clones |\n|---|---|---|')
    for k, v in med.items(): print(f'| {k} | {v*1000:.1f} | {v/base:.1f} |')


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--reps', type=int, default=2)
    p.add_argument('--batches', type=int, default=None, help='batches per epoch (default: the whole epoch)')
    p.add_argument('--micro', action='store_true', help='only the per-tensor cost table')
    args = p.parse_args()
    if args.micro: return micro()
    dls = fashion_dls(1024)
    run_epoch(dls, None, 3)                              # warm up
    times = {k: [] for k in CONFIGS}
    for r in range(args.reps):
        for name, spec in CONFIGS.items():
            times[name].append(run_epoch(dls, spec, args.batches))
            print(f'rep {r} {name}: {times[name][-1]:.2f}s', flush=True)
    base = min(times['no hooks'])
    print(f'\ntorch {torch.__version__}, {torch.get_num_threads()} threads, batches per epoch: {args.batches or len(dls.train)}')
    print('| configuration | best epoch time (s) | vs no hooks |\n|---|---|---|')
    for name, ts in times.items(): print(f'| {name} | {min(ts):.2f} | {min(ts)/base:.2f}x |')


if __name__ == '__main__':
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        main()
