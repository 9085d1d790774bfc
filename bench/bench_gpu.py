"""What the statistics hooks cost on a GPU, where the course runs: full training steps of the lesson CNN (FashionMNIST, batch
1024, float32) and of torchvision's ResNet-18 (batch 256, 224x224, bf16 autocast, channels_last), each with no hooks, a hook
that reads each conv's output once (the floor; and each input and output, the collector's floor), `ActivationStats`, the
default collector (`miniai.statistics`) and the course's hooks, all on the convolutions.

For each configuration: the median step time over shuffled interleaved rounds as a ratio of the same round's plain step
(quartiles beside it), what the hooks add as a multiple of what one read adds, the kernel launches per hook call (CUDA
kernels, memsets and copies counted with `torch.profiler` in one hooked step, minus a plain step, over the hook calls), the
host syncs of one hooked step (`miniai.testing.count_syncs`), the peak memory, and which statistics path the hooks ran (the
Triton kernel when `miniai.triton_kernel.count_launches` sees its launches, else the torch ops). Then the kernel alone, per
call, on one ResNet-sized activation (bf16 channels_last, 256x64x56x56): the Triton pass (row and histogram of every value)
for a few tile sizes and warp counts, the pass with the sketch of every value, and the torch ops it replaces, as multiples
of one read of the same tensor.

One command a lent GPU runs in under 4 minutes; prints the device. On a machine without CUDA it prints "no CUDA device:
skipped" and exits 0.

--smoke: the same steps on the CPU with a tiny batch and few rounds (figures meaningless): checks the script itself where
there is no GPU.

--cpu-ops: on the CPU instead, the torch operators per hook call (`miniai.testing.count_ops`) of the torch path that GPUs
ran so far (`use_kernel('torch')`), and of the Triton path run by Triton's interpreter (`use_kernel('triton')`; its launches
counted with `count_launches`; allocations launch nothing): the hooks themselves, and the kernel functions alone as a hook
call runs them.

Usage (repo root): .venv/bin/python bench/bench_gpu.py [--rounds 12] [--quick] [--json FILE]
                   .venv/bin/python bench/bench_gpu.py --cpu-ops
                   .venv/bin/python bench/bench_gpu.py --smoke

Without miniai installed, the checkout this script sits in is imported. On a machine whose Python has torch, Triton and
torchvision but not miniai's own dependencies (a lent GPU machine's image): fastcore must be there (a pure-Python wheel, carried
and installed with `pip install --no-deps --target`); fastprogress is not needed, a stand-in takes its place when it is missing
(this script draws no progress bar, and fastprogress imports a web framework). One command there, from the repo root:
    PYTHONPATH=/tmp/site python3 bench/bench_gpu.py --json $OUT/bench_gpu.json
"""
import os, sys, types
from pathlib import Path
if '--cpu-ops' in sys.argv: os.environ.setdefault('TRITON_INTERPRET', '1')   # before anything imports Triton
sys.path.append(str(Path(__file__).resolve().parent.parent))    # this checkout's miniai, unless one found earlier on sys.path comes first
try: import fastprogress
except ImportError:          # a stand-in: miniai.learner imports its bars at import time, and nothing here draws one
    fastprogress = sys.modules['fastprogress'] = types.ModuleType('fastprogress')
    def _bar(it=(), *args, **kwargs): return it
    fastprogress.progress_bar = fastprogress.master_bar = _bar
    print("(fastprogress not found: a stand-in without bars)")
import argparse, contextlib, json, platform, random, statistics, time, warnings
import torch, torch.nn.functional as F
from torch import nn
from _timing import clock, quartiles, ratios, one_read, one_read_io
from miniai.learner import baseline_cnn, set_seed
from miniai.hooks import Hooks
from miniai.testing import count_syncs, count_ops
import miniai.activations as A
import miniai.statistics as S
from bench_activations import course_stats   # the course's append_stats (to_cpu, mean, std, histc), as the other benches run it
try: import miniai.triton_kernel as TK
except Exception: TK = None

def convs(model): return [m for m in model.modules() if isinstance(m, nn.Conv2d)]

CONFIGS = ['no hooks', 'one read (floor)', 'one read in+out', 'ActivationStats', 'collector', 'course hooks']
FLOOR = {'ActivationStats': 'one read (floor)', 'course hooks': 'one read (floor)', 'collector': 'one read in+out'}

def attachers(model):
    "`{configuration: a function that hooks `model` and returns what removes the hooks (a context manager)}`."
    astats, coll = A.ActivationStats(nn.Conv2d), S.ActivationStatisticsHook(S.StatisticsConfig())
    return {'no hooks': contextlib.nullcontext,
            'one read (floor)': lambda: Hooks(convs(model), one_read),
            'one read in+out': lambda: Hooks(convs(model), one_read_io),
            'ActivationStats': lambda: astats.attach(model),
            'collector': lambda: coll.attach(model, nn.Conv2d),
            'course hooks': lambda: Hooks(convs(model), course_stats)}

def sync(): torch.cuda.synchronize() if torch.cuda.is_available() else None

def lesson_cnn(dev, bs=1024):
    "The lesson CNN on one FashionMNIST batch of `bs` (random images of that shape when the data set is missing), float32."
    try:
        from miniai.datasets import fashion_dls
        x, y = next(iter(fashion_dls(bs).train))
    except Exception as e:
        print(f"  (FashionMNIST not found: {type(e).__name__}; random images of its shape)")
        x, y = torch.rand(bs, 1, 28, 28), torch.randint(0, 10, (bs,))
    set_seed(1)
    return f'lesson CNN, FashionMNIST, batch {bs}, float32', baseline_cnn().to(dev), x.to(dev), y.to(dev), contextlib.nullcontext

def resnet18(dev, bs=256, size=224):
    "torchvision's ResNet-18 on random `size`x`size` images, channels_last, under bf16 autocast."
    import torchvision
    set_seed(1)
    model = torchvision.models.resnet18(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    x = torch.randn(bs, 3, size, size, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (bs,), device=dev)
    return f'ResNet-18, batch {bs}, {size}x{size}, bf16 autocast, channels_last', model, x, y, lambda: torch.autocast(dev.type, torch.bfloat16)

def stepper(model, x, y, amp):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    def step():
        with amp(): loss = F.cross_entropy(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    return step

def timed(step, attach, reps):
    "Seconds per step of `reps` steps with the hooks of `attach` on (attached before the clock starts, removed after it stops)."
    with attach():
        step(); sync()
        t0 = clock()
        for _ in range(reps): step()
        sync()
        return (clock() - t0) / reps

def launches(step, attach):
    "CUDA kernels, memsets and copies of one step with the hooks of `attach` on (`torch.profiler`), and the hook calls in it."
    from torch.profiler import profile, ProfilerActivity
    from torch.autograd import DeviceType
    gpu = torch.cuda.is_available()
    with attach():
        step(); sync()
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])) as prof:
            step(); sync()
    if gpu: return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
    return sum(1 for e in prof.events() if e.name.startswith('aten::'))     # --smoke: a stand-in figure

def host_syncs(step, attach):
    with attach():
        step(); sync()
        with count_syncs() as cs: step()
        sync()
    return cs.n

def peak_mib(step, attach):
    if not torch.cuda.is_available(): return 0.
    with attach():
        step(); sync()
        torch.cuda.reset_peak_memory_stats()
        step(); step(); sync()
    return torch.cuda.max_memory_allocated() / 2**20

def path_used(step, attach):
    "Which statistics path the hooks of `attach` ran in one step: 'triton' when this module's kernels launched, else 'torch ops'."
    if TK is None: return 'torch ops (no miniai.triton_kernel)'
    with attach(), TK.count_launches() as cl: step(); sync()
    return f'triton ({cl.n} launches in a step)' if cl.n else ('torch ops' if torch.cuda.is_available() else 'not Triton (the loops or the torch ops)')

def bench_model(name, model, x, y, amp, rounds, reps, order=0, slow_reps=None):
    "`slow_reps`: steps per round of the course's hooks (each of their calls copies the output to the host and reads it there)."
    model.train()
    step = stepper(model, x, y, amp)
    att = attachers(model)
    calls = len(convs(model))                      # hook calls per step: each conv once per forward
    for n in CONFIGS: timed(step, att[n], 2)     # warm up: cuDNN's choices, Triton's compiles, the recorders made
    times, rng = {n: [] for n in CONFIGS}, random.Random(order)   # the shuffled order of each round
    for r in range(rounds):
        order = list(CONFIGS); rng.shuffle(order)
        for n in order: times[n].append(timed(step, att[n], slow_reps if n == 'course hooks' and slow_reps else reps))
    base = times['no hooks']
    plain_launches, plain_syncs = launches(step, att['no hooks']), host_syncs(step, att['no hooks'])
    print(f"\n{name}: plain step {statistics.median(base)*1e3:.2f} ms, {calls} hook calls per step (convolutions), {rounds} shuffled rounds of {reps} steps")
    print("| configuration | step / plain step (quartiles) | added, multiple of one read | launches per hook call | host syncs per step (the hooks') | peak memory MiB | statistics path |")
    print("|---|---|---|---|---|---|---|")
    res = {}
    for n in CONFIGS:
        m, q1, q3 = quartiles(ratios(times[n], base))
        add = statistics.median(t - b for t, b in zip(times[n], base))
        mult = ''
        if n in FLOOR:
            fl = statistics.median(t - b for t, b in zip(times[FLOOR[n]], base))
            mult = f"{add / fl:.1f}x" if fl > 0 else 'n/a'
        per_call = (launches(step, att[n]) - plain_launches) / calls if n != 'no hooks' else 0.
        syncs, peak = host_syncs(step, att[n]) - plain_syncs, peak_mib(step, att[n])
        used = path_used(step, att[n]) if n in ('ActivationStats', 'collector') else ''
        print(f"| {n} | **{m:.3f}x** ({q1:.3f}-{q3:.3f}) | {mult} | {per_call:.1f} | {syncs} | {peak:.0f} | {used} |")
        res[n] = dict(ratio=m, q1=q1, q3=q3, added_ms=add * 1e3, launches_per_call=per_call, syncs=syncs, peak_mib=peak, path=used, times=times[n])
    return res

def cuda_ms(f, reps=20):
    "Milliseconds per call of `f()` on the GPU (CUDA events, after a warm-up call); on the clock without one (--smoke)."
    f(); sync()
    if not torch.cuda.is_available():
        t0 = clock()
        for _ in range(reps): f()
        return (clock() - t0) / reps * 1e3
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps): f()
    b.record(); sync()
    return a.elapsed_time(b) / reps

def bench_kernel(dev, shape=(256, 64, 56, 56), reps=20):
    "The statistics of one ResNet-sized activation per call: the Triton pass for a few tile sizes and warp counts, and the torch ops, as multiples of one read."
    from miniai.kernel import moments_torch, sample_bins_torch
    x = torch.randn(*shape, device=dev).relu_().to(torch.bfloat16).to(memory_format=torch.channels_last)
    gb = x.numel() * x.element_size() / 1e9
    read = cuda_ms(lambda: x.sum(), reps)
    print(f"\nOne activation, {tuple(x.shape)} bf16 channels_last ({gb*1e3:.0f} MB): one read (x.sum()) {read:.3f} ms = {gb/read*1e3:.0f} GB/s")
    print("| what | ms per call | multiple of one read | GB/s |")
    print("|---|---|---|---|")
    def torch_ops():
        f = x.reshape(-1).float()
        moments_torch(f, 0.25, 10., minmax=False); sample_bins_torch(f, 40, 10.)
    t = cuda_ms(torch_ops, max(reps // 4, 1))
    print(f"| torch ops (row, and the bins of every value) | {t:.3f} | {t/read:.1f}x | {gb/t*1e3:.0f} |")
    res = {'one read': read, 'torch ops': t}
    if TK is None: return res
    block0, warps0 = TK._BLOCK, TK._WARPS
    try:
        for block, warps in ((2048, 8), (1024, 4), (4096, 8), (2048, 4), (4096, 16)):
            TK._BLOCK, TK._WARPS = block, warps
            t = cuda_ms(lambda: TK.triton_moments_hist(x, 0.25, 10., 40, minmax=False), reps)
            print(f"| Triton pass, tiles of {block}, {warps} warps | {t:.3f} | **{t/read:.2f}x** | {gb/t*1e3:.0f} |")
            res[f'triton {block}/{warps}'] = t
    finally: TK._BLOCK, TK._WARPS = block0, warps0
    from miniai.sketch import QuantileSketch, _skp
    counts = QuantileSketch(level=0).counts.to(dev)
    t = cuda_ms(lambda: TK.triton_moments_sketch(x, 0.25, 10., counts, _skp(0), zeros=False, ranges=False), reps)
    print(f"| Triton pass with the sketch of every value (atomics into its buckets) | {t:.3f} | **{t/read:.2f}x** | {gb/t*1e3:.0f} |")
    res['triton sketch'] = t
    return res

# ----- on the CPU: operators and launches per hook call

def hook_ops(model, x, kind):
    "Per hook call of `kind` ('ActivationStats' or 'collector') on the convs of `model`, one forward after three: torch ops (non-view), those that launch (allocations do not), Triton launches."
    att = attachers(model)[kind]
    with torch.no_grad():
        with count_ops() as plain: model(x)
        with att():
            for _ in range(3): model(x)
            launch = TK.count_launches() if TK is not None else contextlib.nullcontext()
            with count_ops() as hooked, launch as cl: model(x)
    calls = len(convs(model))
    ops = [o for o in hooked.ops]
    for o in plain.ops: ops.remove(o) if o in ops else None
    allocs = sum(o.startswith('empty') for o in ops)
    return (hooked.n - plain.n) / calls, (hooked.n - plain.n - allocs) / calls, (getattr(cl, 'n', 0) or 0) / calls

def cpu_ops():
    from miniai.kernel import use_kernel
    set_seed(1)
    model = baseline_cnn().train()
    x = torch.rand(256, 1, 28, 28)
    print(f"CPU: {platform.processor() or platform.machine()}; torch {torch.__version__}; the lesson CNN, batch {len(x)}, hooks on its {len(convs(model))} convs")
    print("| path | hook | torch ops per call (non-view) | of them launching (not allocations) | Triton launches per call |")
    print("|---|---|---|---|---|")
    for kind in ('ActivationStats', 'collector'):
        with use_kernel('torch'): o, l, t = hook_ops(model, x, kind)
        print(f"| torch ops (`use_kernel('torch')`) | {kind} | {o:.1f} | {l:.1f} | {t:.1f} |")
    if TK is None or not TK._interpreting(): print("(no Triton interpreter here: the Triton rows are left out)"); return
    for kind in ('ActivationStats', 'collector'):
        with use_kernel('triton'): o, l, t = hook_ops(model, x, kind)
        print(f"| Triton (`use_kernel('triton')`, interpreter) | {kind} | {o:.1f} | {l:.1f} | {t:.1f} |")
    # the kernel functions as a hook call runs them: ActivationStats, the row and histogram of the output; the collector, the
    # row and the sketch of the input and of the output
    from miniai.sketch import QuantileSketch, _skp
    out = model[0](x).detach()
    counts = QuantileSketch(level=0).counts
    for kind, f in (('ActivationStats', lambda: TK.triton_moments_hist(out, 0.25, 10., 40, minmax=False)),
                    ('collector', lambda: [TK.triton_moments_sketch(t, 0.25, 10., counts, _skp(0), zeros=False, ranges=False) for t in (x, out)])):
        f()
        with count_ops() as co, TK.count_launches() as cl: f()
        print(f"| Triton kernel functions alone (interpreter) | {kind} | {co.n} | {co.n - sum(o.startswith('empty') for o in co.ops)} | {cl.n} |")

def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--rounds', type=int, default=12, help='shuffled rounds per model')
    p.add_argument('--quick', action='store_true', help='4 rounds, fewer steps (a smoke run)')
    p.add_argument('--cpu-ops', action='store_true', help='count ops and launches per hook call on the CPU instead')
    p.add_argument('--smoke', action='store_true', help='tiny steps on the CPU: checks the script without a GPU')
    p.add_argument('--json', help='write the raw figures here')
    args = p.parse_args()
    warnings.filterwarnings('ignore')
    if args.cpu_ops: return cpu_ops()
    if args.smoke:
        dev = torch.device('cpu')
        bench_model(*lesson_cnn(dev, 64), rounds=2, reps=1)
        bench_model(*resnet18(dev, 2, 32), rounds=2, reps=1)
        os.environ['TRITON_INTERPRET'] = '1'          # the Triton kernel on a CPU tensor, in the interpreter
        bench_kernel(dev, (2, 8, 16, 16), reps=1)
        print("smoke run: the figures above mean nothing"); return
    if not torch.cuda.is_available():
        print("no CUDA device: skipped"); return
    t_start = time.time()
    dev = torch.device('cuda')
    torch.backends.cudnn.benchmark = True
    import triton
    print(f"GPU: {torch.cuda.get_device_name(dev)}; torch {torch.__version__}, CUDA {torch.version.cuda}, Triton {triton.__version__}; "
          f"MINIAI_KERNEL={os.environ.get('MINIAI_KERNEL', '(unset)')}")
    rounds = 4 if args.quick else args.rounds
    res = {'device': torch.cuda.get_device_name(dev)}
    res['cnn'] = bench_model(*lesson_cnn(dev), rounds=rounds, reps=5 if args.quick else 10)
    res['resnet18'] = bench_model(*resnet18(dev), rounds=max(rounds * 2 // 3, 2), reps=2 if args.quick else 3, slow_reps=1)
    res['kernel'] = bench_kernel(dev)
    print(f"\nbench_gpu.py took {time.time() - t_start:.0f} s")
    if args.json: json.dump(res, open(args.json, 'w'))

if __name__ == '__main__': main()
