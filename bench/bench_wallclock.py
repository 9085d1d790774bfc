"""What the hooks cost on the user's clock: a whole `fit(1)` of the lesson-10 baseline, wall clock, torch's default threads.

Each configuration trains a fresh `baseline_cnn()` for one epoch of `fashion_dls(1024)` with validation (59 training and
10 validation batches, lr 0.6), with its hooks on the model's five convolutions, and reads its statistics once at the end
(inside the timing). Rounds are interleaved: each round runs every configuration once, in a new random order, and each
time is divided by the same round's no-hook time; the table gives the median ratio over rounds and its quartiles.

Because whole epochs on a shared VM swing by several percent from round to round, the hook functions are also timed
from the inside (`perf_counter` around each call): that sum over the epoch, divided by the round's no-hook epoch, is the
share the hooks themselves take, and divided by the calls, their cost per call.

Configurations:
  no hooks          the reference
  one read (floor)  a hook that reads each activation once (`outp.sum()`): the least any statistic of every value costs
  course hooks      the course's `append_stats` (to_cpu, mean, std, histc of |x|)
  ActivationStats   lesson 10: exact counts/mean/std/dead/overflow fractions + a sampled |x| histogram per batch
  StatisticsConfig  the reference design: ActivationStatisticsHook(StatisticsConfig(mean, std, min/max, p95/p99)) as a
                    forward hook on every Conv2d and Linear, named by `_hook_name` (inputs and outputs)
  moments only      the same with collect_percentiles=[] (count, NaN/Inf, mean, std, min, max)

--ops: torch ops per hook call on the torch path that other devices run (`fused_kernel(False)`), counted with a
TorchDispatchMode over one training batch.

Usage (repo root): .venv/bin/python bench/bench_wallclock.py --rounds 7 [--ops]
"""
import argparse, json, random, statistics, time, warnings
import torch, torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from miniai.datasets import fashion_dls
from miniai.learner import Learner, TrainCB, baseline_cnn, set_seed
from miniai.hooks import HooksCallback
import miniai.activations as A
import miniai.statistics as S
from miniai.kernel import fused_kernel
from bench_activations import course_stats   # the course's append_stats, as the other benches run it

clock = time.perf_counter
inside, calls = [0.], [0]

def timed(f):
    "`f`, adding the wall time spent in it to `inside` and counting its calls."
    def g(*args, **kwargs):
        t0 = clock()
        try: return f(*args, **kwargs)
        finally:
            inside[0] += clock() - t0; calls[0] += 1
    return g

def one_read(hook, mod, inp, outp):
    if not hasattr(hook, 'sums'): hook.sums = []
    hook.sums.append(outp.detach().sum())

def reference_hook(model, config):
    "The reference design's registration: every Conv2d and Linear, named by `_hook_name`, `register_forward_hook(hook)`."
    hook = S.ActivationStatisticsHook(config)
    hook.update_statistics = timed(hook.update_statistics)
    handles = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            m._hook_name = name
            handles.append(m.register_forward_hook(hook))
    return hook, handles

CONFIGS = ['no hooks', 'one read (floor)', 'course hooks', 'ActivationStats', 'StatisticsConfig', 'moments only']

def run(dls, name):
    "Seconds of one `fit(1)` with `name`'s hooks, and the seconds spent inside the hook functions."
    set_seed(1)
    model = baseline_cnn()
    cbs, handles, hook, astats = [TrainCB()], [], None, None
    inside[0], calls[0] = 0., 0
    if name == 'ActivationStats':
        orig, A.append_stats = A.append_stats, timed(A.append_stats)   # the callback takes the hook function when built
        try: cbs.append(astats := A.ActivationStats(nn.Conv2d))
        finally: A.append_stats = orig
    elif name == 'course hooks': cbs.append(HooksCallback(timed(course_stats), nn.Conv2d))
    elif name == 'one read (floor)': cbs.append(HooksCallback(timed(one_read), nn.Conv2d))
    elif name == 'StatisticsConfig': hook, handles = reference_hook(model, S.StatisticsConfig(collect_percentiles=[95, 99]))
    elif name == 'moments only': hook, handles = reference_hook(model, S.StatisticsConfig(collect_percentiles=[], max_samples=None))
    learn = Learner(model, dls, loss_func=F.cross_entropy, lr=0.6, cbs=cbs)
    t0 = clock()
    learn.fit(1)
    if hook is not None: hook.get_all_statistics()
    if astats is not None: [h.stats[1] for h in astats.hooks]
    dt = clock() - t0
    for h in handles: h.remove()
    return dt, inside[0], calls[0]

class count_ops(TorchDispatchMode):
    def __init__(self): super().__init__(); self.n = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))

def ops_per_call(dls):
    "Torch ops per hook call on the torch path, for ActivationStats and the reference design's default config."
    x, y = next(iter(dls.train))
    res = {}
    for name in ('ActivationStats', 'StatisticsConfig'):
        set_seed(1)
        model = baseline_cnn()
        with fused_kernel(False):
            model(x)                                  # warm up: compile nothing inside the count
            with count_ops() as plain: model(x)
            if name == 'ActivationStats':
                hooks = A.Hooks([m for m in model.modules() if isinstance(m, nn.Conv2d)], A.append_stats)
                model(x)
                with count_ops() as hooked: model(x)
                hooks.remove(); n_calls = len(hooks)
            else:
                hook, handles = reference_hook(model, S.StatisticsConfig())
                model(x)
                with count_ops() as hooked: model(x)
                for h in handles: h.remove()
                n_calls = len(handles)
        res[name] = (hooked.n - plain.n) / n_calls
    return res

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rounds', type=int, default=7)
    p.add_argument('--ops', action='store_true', help='also count torch ops per hook call on the torch path')
    p.add_argument('--json', help='write the raw timings here')
    args = p.parse_args()
    warnings.filterwarnings('ignore')
    dls = fashion_dls(1024)
    for name in CONFIGS: run(dls, name)                # warm up: compile the loops, fill caches
    times = {n: [] for n in CONFIGS}
    ins = {n: [] for n in CONFIGS}
    ncalls = {}
    rng = random.Random(0)
    for r in range(args.rounds):
        order = CONFIGS[:]; rng.shuffle(order)
        for name in order:
            dt, ti, nc = run(dls, name)
            times[name].append(dt); ins[name].append(ti); ncalls[name] = nc
        print(f'round {r}: ' + ', '.join(f'{n} {times[n][-1]:.2f}s' for n in CONFIGS), flush=True)
    base = times['no hooks']
    print(f"\nthreads {torch.get_num_threads()}, torch {torch.__version__}, {args.rounds} rounds; no-hook fit(1): median {statistics.median(base):.2f} s")
    print(f"| configuration | whole fit(1), median ratio (quartiles) | inside the hooks, share of the no-hook fit | per hook call |")
    print(f"|---|---|---|---|")
    for name in CONFIGS[1:]:
        ratios = sorted(t / b for t, b in zip(times[name], base))
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        share = statistics.median(i / b for i, b in zip(ins[name], base))
        per = statistics.median(ins[name]) / max(ncalls[name], 1) * 1e6 if ncalls[name] else float('nan')
        print(f"| {name} | **{statistics.median(ratios):.3f}x** ({q[0]:.3f}-{q[2]:.3f}) | {share:.1%} | {per:.0f} µs ({ncalls[name]} calls) |")
    if args.ops: print('\ntorch ops per hook call on the torch path (fused_kernel(False)):', {k: round(v, 1) for k, v in ops_per_call(dls).items()})
    if args.json: json.dump(dict(times=times, inside=ins, calls=ncalls), open(args.json, 'w'))

if __name__ == '__main__': main()
