"""A fresh install's long run on a busy machine: N training steps of the lesson-10 baseline (batch 1024) with hooks made
as a user would, in a fresh process with an empty numba cache, so that the loops compile while training runs. Prints the
hooked steps' total against a plain step, the step at which the loops were ready, the longest step (a wait for the
loops), and whether miniai warned that it waited.

Usage (repo root): .venv/bin/python bench/bench_cold_long.py [--steps 300] [--hooks ActivationStats StatisticsConfig] [--baseline DIR]
--baseline DIR: DIR holds another copy of the package (`DIR/miniai`, e.g. `git archive HEAD miniai | tar -x -C DIR`),
                run the same way just before, for a before/after.
"""
import argparse, os, subprocess, sys, tempfile, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUN = r"""
import sys, statistics, time, warnings, torch, torch.nn.functional as F
from torch import nn
from miniai.learner import baseline_cnn, set_seed
from miniai.activations import ActivationStats
from miniai.statistics import ActivationStatisticsHook
import miniai.kernel as K
set_seed(1); model = baseline_cnn(); opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(1024, 1, 28, 28), torch.randint(0, 10, (1024,))
def step():
    t0 = time.perf_counter(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step(); opt.zero_grad(); return time.perf_counter() - t0
plain = statistics.median([step() for _ in range(8)][2:])
what, n = sys.argv[1], int(sys.argv[2])
rec = ActivationStats(nn.Conv2d) if what == 'ActivationStats' else ActivationStatisticsHook()
ts, ready = [], None
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    with (rec.attach(model) if what == 'ActivationStats' else rec.attach(model, nn.Conv2d)):
        for i in range(n):
            ts.append(step())
            if ready is None and 'record' in K._LOOPS: ready = i
waited = any('still compiling' in str(w.message) for w in caught)
print(K.__file__)
print(f"{what}, {n} steps: {sum(ts):.1f} s hooked, {sum(ts) / (n * plain):.2f}x a plain step ({plain * 1e3:.0f} ms); "
      f"loops ready at step {ready}; longest step {max(ts):.1f} s; warned of a wait: {waited}")
"""

def run(what, steps, package=None):
    "One fresh process, an empty numba cache; waits for its compiling child to finish before the next run."
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, 'NUMBA_CACHE_DIR': cache}
        env.pop('MINIAI_FUSED', None)
        env['PYTHONPATH'] = os.pathsep.join([package or ROOT, env.get('PYTHONPATH', '')])
        out = subprocess.run([sys.executable, '-c', RUN, what, str(steps)], capture_output=True, text=True, env=env, timeout=1800,
                             cwd=cache)   # not the repo: `python -c` puts the working folder first on sys.path, ahead of PYTHONPATH
        if f"{package or ROOT}{os.sep}miniai" not in out.stdout: raise RuntimeError(f'the run imported another miniai:\n{out.stdout}{out.stderr[-2000:]}')
        if out.returncode: raise RuntimeError(out.stderr[-2000:])
        time.sleep(20)   # the compiling child of that process goes on after it; let it finish (idle priority) before the next
        return out.stdout.strip()

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--steps', type=int, default=300)
    p.add_argument('--hooks', nargs='+', default=['ActivationStats', 'StatisticsConfig'])
    p.add_argument('--baseline', help='folder holding another copy of the package (DIR/miniai), run just before each')
    args = p.parse_args()
    print(f"CPU cores {os.cpu_count()}; load average {os.getloadavg()[0]:.1f} at the start")
    for what in args.hooks:
        if args.baseline: print('baseline:', run(what, args.steps, args.baseline))
        print('this tree:', run(what, args.steps))

if __name__ == '__main__': main()
