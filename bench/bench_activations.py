"""Overhead of activation statistics on one epoch of the lesson-10 baseline (FashionMNIST, batch 1024, 2 CPU cores).

Measured in one run, interleaved, each configuration `--rounds` times (median epoch time; overhead is the median
over rounds of that round's time / that round's no-hook time):
  none      no hooks
  course    the course's append_stats (to_cpu copy, mean, std, 40-bin histc of |x|) on the 5 convs
  ours      ActivationStats (mean, std, 40-bin |x| histogram from a 16K stratified random sample) on the 5 convs
  exact     ActivationStats(exact=True): every value binned
  histc     ActivationStats-like hook with exact torch.histc instead of our bincount (the reference for `exact`)
Usage: .venv/bin/python bench/bench_activations.py [--rounds 3]
"""
import argparse, statistics, time, json
import torch, torch.nn.functional as F, fastcore.all as fc
from torch import nn
from miniai.datasets import fashion_dls
from miniai.learner import Learner, TrainCB, baseline_cnn, set_seed, to_cpu
from miniai.activations import ActivationStats, HooksCallback, moments

def course_stats(hook, mod, inp, outp):
    if not hasattr(hook, 'stats'): hook.stats = ([], [], [])
    acts = to_cpu(outp)
    hook.stats[0].append(acts.mean()); hook.stats[1].append(acts.std())
    hook.stats[2].append(acts.abs().histc(40, 0, 10))

def histc_stats(hook, mod, inp, outp):
    if not hasattr(hook, 'buf'): hook.buf = []
    hook.buf.append((moments(outp, minmax=False), outp.detach().abs().histc(40, 0, 10)))

def make_cb(kind):
    conv = fc.risinstance(nn.Conv2d)
    return {'none': None, 'course': lambda: HooksCallback(course_stats, conv), 'ours': lambda: ActivationStats(conv),
            'exact': lambda: ActivationStats(conv, exact=True), 'histc': lambda: HooksCallback(histc_stats, conv)}[kind]

def epoch_time(dls, kind):
    set_seed(1)
    f = make_cb(kind)
    cbs = [TrainCB()] + ([f()] if f else [])
    learn = Learner(baseline_cnn(), dls, F.cross_entropy, lr=0.6, cbs=cbs)
    t0 = time.perf_counter(); learn.fit(1); return time.perf_counter() - t0

if __name__ == '__main__':
    p = argparse.ArgumentParser(); p.add_argument('--rounds', type=int, default=3); args = p.parse_args()
    dls = fashion_dls(1024)
    kinds = ['none', 'course', 'ours', 'exact', 'histc']
    epoch_time(dls, 'none')  # warm-up
    times = {k: [] for k in kinds}
    for r in range(args.rounds):
        for k in kinds: times[k].append(epoch_time(dls, k))
    med = {k: statistics.median(v) for k, v in times.items()}
    # each round's ratio to that round's no-hook epoch, then the median: steadier than a ratio of medians on a noisy VM
    ratio = {k: statistics.median(t/n for t, n in zip(times[k], times['none'])) for k in kinds}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, rounds {args.rounds}")
    print(f"{'config':<8}{'epoch s':>9}{'overhead':>10}")
    for k in kinds: print(f"{k:<8}{med[k]:>9.2f}{(ratio[k]-1)*100:>9.1f}%")
    print(json.dumps({k: [round(t, 3) for t in v] for k, v in times.items()}))
