"""Lesson 11's variants (miniai.init.make_variant) side by side: test accuracy and epoch time, same epochs each.

Every variant is trained with its own recipe from `make_variant` (`variant_defaults`: optimiser, one-cycle schedule,
peak lr and batch size) on FashionMNIST for `--epochs` epochs, for each seed in `--seeds`; no hooks attached.
Reported per variant: test accuracy after the last epoch (mean and range over seeds) and the median time of a
training epoch and of a validation pass.
Usage (repo root): .venv/bin/python bench/bench_init.py [--bs N (default: each variant's own)] [--epochs 3] [--seeds 1,2] [--threads N]
"""
import argparse, os, statistics, time
import torch
from miniai.datasets import fashion_dls
from miniai.learner import Callback, MetricsCB
from miniai.init import variant_names, variant_defaults, make_variant, variant_learner
from torcheval.metrics import MulticlassAccuracy
from _timing import clock   # the bench scripts' one timing helper

class EpochTimer(Callback):
    "Wall time of each training epoch and validation pass."
    def before_fit(self): self.train, self.valid = [], []
    def before_epoch(self): self.t0 = clock()
    def after_epoch(self): (self.train if self.learn.training else self.valid).append(clock() - self.t0)

def run(name, dls, epochs, seed):
    v = make_variant(name, dls, seed=seed)
    metrics, timer = MetricsCB(accuracy=MulticlassAccuracy()), EpochTimer()
    metrics._log = lambda d: None
    variant_learner(v, dls, [metrics, timer]).fit(epochs)
    return float(metrics.log_hist[-1]['accuracy']), timer.train, timer.valid

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--bs', type=int, default=None, help="batch size (default: each variant's own, variant_defaults(name)['bs'])")
    p.add_argument('--epochs', type=int, default=3)
    p.add_argument('--seeds', default='1')
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--variants', default=','.join(variant_names))
    args = p.parse_args()
    if args.threads: torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(',')]
    dls_by_bs = {}
    load0, t_start = os.getloadavg()[0], clock()
    rows = []
    for name in args.variants.split(','):
        bs = args.bs or variant_defaults(name)['bs']
        if bs not in dls_by_bs: dls_by_bs[bs] = fashion_dls(bs)
        dls = dls_by_bs[bs]
        accs, trains, valids = [], [], []
        for seed in seeds:
            acc, tr, va = run(name, dls, args.epochs, seed)
            accs.append(acc); trains += tr; valids += va
            print(f'{name} seed {seed}: accuracy {acc:.4f}, train epochs {[round(t, 2) for t in tr]} s', flush=True)
        rows.append((name, bs, accs, statistics.median(trains), statistics.median(valids)))
    print(f"\ntorch {torch.__version__}, {torch.get_num_threads()} threads, bs {args.bs or 'per variant'}, {args.epochs} epochs, seeds {seeds}, "
          f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}, total {clock()-t_start:.0f} s\n")
    print('| variant | batch size | test accuracy (mean, min-max over seeds) | per seed | train epoch (s, median) | validation pass (s, median) |')
    print('|---|---|---|---|---|---|')
    for name, bs, accs, tr, va in rows:
        rng = f' ({min(accs):.3f}-{max(accs):.3f})' if len(accs) > 1 else ''
        print(f'| {name} | {bs} | {statistics.mean(accs):.3f}{rng} | {", ".join(f"{a:.3f}" for a in accs)} | {tr:.2f} | {va:.2f} |')
