"""The fault zoo (miniai.zoo, lesson 10h): every healthy configuration and every injected fault, judged by `diagnose`
with its default settings, as a confusion table and a summary line.

Each case builds its model from its config (nothing downloaded), injects its fault, trains it (one step at 'init',
16 at 'trained') with `ActivationStats` attached, and scores the verdict: a fault is caught when its layer is flagged;
the goal is every fault caught with at most one other layer flagged, and no flag on a healthy case.
Usage (repo root): .venv/bin/python bench/bench_zoo.py [--subset] [--configs a,b] [--steps 16] [--threads 1]
"""
import argparse, datetime, subprocess, sys, time
from pathlib import Path
import torch
from miniai import zoo
from _timing import clock, cpu_name   # the bench scripts' one timing helper

def commit():
    try: return subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True, cwd=Path(__file__).parent).stdout.strip()
    except OSError: return '?'

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--subset', action='store_true', help="only the small subset that tests/verdict/test_zoo.py runs")
    p.add_argument('--configs', default=None, help="comma-separated configuration names (default: all)")
    p.add_argument('--steps', type=int, default=zoo.STEPS)
    p.add_argument('--threads', type=int, default=1, help="torch threads (default 1: models this small train fastest on one, and a shared machine's other threads make two wait at every barrier)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    which = zoo.SUBSET if args.subset else zoo.cases(configs=args.configs.split(',') if args.configs else None)
    print(f"# {datetime.date.today()}, commit {commit()}, torch {torch.__version__}, {cpu_name()}, {torch.get_num_threads()} threads, "
          f"{len(which)} cases", flush=True)
    t0 = clock()
    def progress(r): print(f"  {str(r.case):<48}{r.seconds:6.1f} s", file=sys.stderr, flush=True)
    results = zoo.run_zoo(which, steps=args.steps, progress=progress)
    print(zoo.confusion_table(results))
    print(zoo.summary(results))
    print(f"# {clock() - t0:.0f} s in all")
