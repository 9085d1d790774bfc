"""A fresh install's long run on a busy machine: N training steps of the lesson-10 baseline (batch 1024) with hooks made
as a user would, in a fresh process with an empty numba cache, so that the loops compile while training runs (the same
process as `bench_wallclock.py --cold`, longer). Prints the hooked steps' total against a plain step, the step at which the
loops were ready, the longest step (a wait for the loops), and whether miniai warned that it waited.

Usage (repo root): .venv/bin/python bench/bench_cold_long.py [--steps 300] [--hooks ActivationStats StatisticsConfig] [--baseline DIR]
--baseline DIR: DIR holds another copy of the package (`DIR/miniai`, e.g. `git archive HEAD miniai | tar -x -C DIR`),
                run the same way just before, for a before/after.
"""
import argparse, os, tempfile
from bench_wallclock import cold_start, wait_for_cache

def run(what, steps, package=None):
    "One fresh process with an empty numba cache; its compiling child goes on after it, so wait for it before the next run."
    with tempfile.TemporaryDirectory() as cache:
        plain, _, ready, waited, hooked = cold_start(cache, what, steps, package)
        wait_for_cache(cache)
    return (f"{what}, {steps} steps: {sum(hooked):.1f} s hooked, {sum(hooked) / (steps * plain):.2f}x a plain step ({plain * 1e3:.0f} ms); "
            f"loops ready at step {ready if ready >= 0 else None}; longest step {max(hooked):.1f} s; warned of a wait: {waited}")

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--steps', type=int, default=300)
    p.add_argument('--hooks', nargs='+', default=['ActivationStats', 'StatisticsConfig'])
    p.add_argument('--baseline', help='folder holding another copy of the package (DIR/miniai), run just before each')
    args = p.parse_args()
    print(f"CPU cores {os.cpu_count()}; load average {os.getloadavg()[0]:.1f} at the start")
    for what in args.hooks:
        if args.baseline: print('baseline:', run(what, args.steps, os.path.abspath(args.baseline)))
        print('this tree:', run(what, args.steps))

if __name__ == '__main__': main()
