"""Data loading cost vs training cost for one epoch of the lesson-10 baseline (FashionMNIST train split, batch 1024).

  load_fast    one pass over fashion_dls(1024).train (miniai's tensor_dd batch path)
  load_course  one pass with the course's per-item transform (TF.to_tensor on each PIL image), 0 workers
  train        one training epoch of the baseline CNN on batches already in memory (no loading)
Goal: load_fast / train <= 15%.  Usage: .venv/bin/python bench/bench_data.py [--rounds 3] [--skip-course]
"""
import argparse, statistics, time
import torch, torch.nn.functional as F
import torchvision.transforms.functional as TF
from miniai.datasets import fashion_dls, load_fashion_mnist, DataLoaders, inplace
from miniai.learner import Learner, TrainCB, baseline_cnn, set_seed

from _timing import once as timed   # the bench scripts' one timing helper

def one_pass(dl):
    for b in dl: pass

if __name__ == '__main__':
    p = argparse.ArgumentParser(); p.add_argument('--rounds', type=int, default=3); p.add_argument('--skip-course', action='store_true')
    args = p.parse_args()
    t_load_dd = timed(load_fashion_mnist)
    dls = fashion_dls(1024)
    batches = list(dls.train)
    mem = DataLoaders(batches, [])
    res = {'load_fast': [], 'train': [], 'load_course': []}
    for r in range(args.rounds):
        res['load_fast'].append(timed(lambda: one_pass(dls.train)))
        set_seed(1)
        learn = Learner(baseline_cnn(), mem, F.cross_entropy, lr=0.6, cbs=[TrainCB()])
        res['train'].append(timed(lambda: learn.fit(1, valid=False)))
    if not args.skip_course:
        @inplace
        def transformi(b): b['image'] = [TF.to_tensor(o) for o in b['image']]
        slow = DataLoaders.from_dd(load_fashion_mnist().with_transform(transformi), 1024)
        res['load_course'].append(timed(lambda: one_pass(slow.train)))
    med = {k: statistics.median(v) for k, v in res.items() if v}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, rounds {args.rounds}")
    print(f"second load_fashion_mnist(): {t_load_dd:.3f}s (cached Arrow)")
    for k, v in med.items(): print(f"{k:<12}{v:>8.2f}s")
    print(f"load_fast / train = {med['load_fast']/med['train']*100:.1f}%")
    if 'load_course' in med: print(f"load_course / train = {med['load_course']/med['train']*100:.0f}%")
