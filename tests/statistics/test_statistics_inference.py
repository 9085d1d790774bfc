"""Run-wide statistics under torch's modes and beside the user's own tools.

- A statistics state first fed inside `torch.inference_mode()` (a calibration pass) or `no_grad` keeps recording outside it,
  with the very numbers of a state fed outside, on both kernel paths (the compiled CPU loops and the torch ops every GPU runs).
- Every hook the statistics register copies and pickles as an inert function: a model with `ActivationStatisticsHook`
  attached (and after its removal) deep-copies and saves; inside `paused_recording()` nothing is counted.
- The statistics never write into the user's tensors: inputs, outputs and gradients stay bit-identical in every float dtype."""
import copy, io, math, threading, warnings
import pytest, torch
import torch.nn.functional as F
from torch import nn
from miniai import kernel
from miniai.core import paused_recording
from miniai.hooks import HookFn
from miniai.sketch import QuantileSketch, SketchRecorder
from miniai.statistics import StatisticsCollector, StatisticsConfig, ActivationStatisticsHook

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
FULL = dict(collect_histogram=True, histogram_bins=20, collect_sparsity=True, collect_percentiles=[1, 50, 99])
pytestmark = pytest.mark.usefixtures('one_thread')   # many small tensor ops: one torch thread on a loaded machine

CONFIGS = {'default': {}, 'full': FULL, 'exact': dict(FULL, exact=True, max_samples=None)}

@pytest.fixture(params=[True, False], ids=['fused', 'torch-ops'])
def fused(request):
    "Run the test with the compiled CPU loops, then with the torch ops (`_FUSED[0]` restored after)."
    with kernel.use_kernel('loops' if request.param else 'torch'): yield request.param

def _batches():
    "Small batches (whole into the sketch, into the exact buffer), large ones (sampled), NaN/Inf, a half dtype and a strided view."
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(8, 50, generator=g), torch.randn(64, 700, generator=g).relu()]
    xs[1][::7, ::3] = math.nan; xs[1][3, 5] = math.inf
    xs += [torch.randn(300, 100, generator=g).t(), torch.randn(40, 600, generator=g).to(torch.bfloat16)]
    xs += [torch.randn(16, 1100, generator=g) * 3 for _ in range(17)]       # 17,600 values each: sampled, 16 pending flushed
    return xs

def _read(c):
    "Everything a collector reports, with the time of the last update taken out."
    sd = c.state_dict()
    for m in sd['modules'].values(): m['last_updated'] = None
    return sd, {n: (st.inputs, st.outputs) for n, st in c.get_all_statistics().items()}

def _in_fresh_thread(f):
    "Run `f` in a new thread (its own kernel scratch buffers), re-raising what it raised."
    err = []
    def run():
        try: f()
        except BaseException as e: err.append(e)
    t = threading.Thread(target=run); t.start(); t.join()
    if err: raise err[0]

@pytest.mark.parametrize('mode', [torch.inference_mode, torch.no_grad])
@pytest.mark.parametrize('cfg', list(CONFIGS))
def test_a_collector_first_fed_in_inference_mode_keeps_recording(mode, cfg, fused):
    xs = _batches()
    def run():
        first, ref = StatisticsCollector(StatisticsConfig(**CONFIGS[cfg])), StatisticsCollector(StatisticsConfig(**CONFIGS[cfg]))
        with mode():
            for x in xs[:2]: first.update_statistics('layer', x, x * 2)
        for x in xs[2:]: first.update_statistics('layer', x, x * 2)
        for x in xs: ref.update_statistics('layer', x, x * 2)
        assert _read(first) == _read(ref)
        # and back inside the mode, then out again: still the same numbers as the state fed outside
        with mode(): first.update_statistics('layer', xs[5], xs[5]); ref_in = first.get_statistics('layer')
        ref.update_statistics('layer', xs[5], xs[5])
        first.update_statistics('layer', xs[6], xs[6]); ref.update_statistics('layer', xs[6], xs[6])
        assert ref_in.n_updates == len(xs) + 1 and _read(first) == _read(ref)
    _in_fresh_thread(run)

def test_a_hooked_calibration_pass_in_inference_mode_then_training(fused):
    "A calibration as users write it: `ActivationStatisticsHook` attached, a calibration forward under inference_mode, then training steps."
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4*12*12, 3))
    xb, yb = torch.randn(16, 1, 12, 12), torch.randint(0, 3, (16,))
    def run(calibrate_in):
        m = copy.deepcopy(model)
        hook = ActivationStatisticsHook(StatisticsConfig(**FULL))
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        with hook.attach(m):
            with calibrate_in(): m(xb.to(memory_format=torch.channels_last))
            for _ in range(3):
                F.cross_entropy(m(xb), yb).backward(); opt.step(); opt.zero_grad()
        return _read(hook)
    assert run(torch.inference_mode) == run(torch.no_grad)

@pytest.mark.parametrize('mode', [torch.inference_mode, torch.no_grad])
def test_sketch_and_recorder_made_in_inference_mode_keep_counting(mode, fused):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(5000, generator=g), torch.randn(40_000, generator=g)
    with mode(): sk, rec, small = QuantileSketch().add(a), SketchRecorder(), QuantileSketch(level=1).add(b)
    with mode(): rec.record(b)
    sk.add(b).merge(small); sk.coarsen(2); rec.record(a); rec.flush()
    ref_rec = SketchRecorder(); ref_rec.record(b); ref_rec.record(a); ref_rec.flush()
    assert torch.equal(sk.counts, QuantileSketch().add(a).add(b).merge(QuantileSketch(level=1).add(b)).coarsen(2).counts)
    assert torch.equal(rec.sketch.counts, ref_rec.sketch.counts) and torch.equal(_bits(rec.total.t), _bits(ref_rec.total.t))   # NaN: the fields not counted
    assert not sk.counts.is_inference() and not rec.sketch.counts.is_inference()

def test_merged_and_loaded_in_inference_mode_then_updated(fused):
    xs = _batches()
    a, b, whole = (StatisticsCollector(StatisticsConfig(**FULL)) for _ in range(3))
    for x in xs[:4]: a.update_statistics('m', None, x)
    for x in xs[4:8]: b.update_statistics('m', None, x)
    with torch.inference_mode():
        merged = StatisticsCollector(StatisticsConfig(**FULL)).merge(a).merge(b)
        loaded = StatisticsCollector(StatisticsConfig(**FULL)).load_state_dict(merged.state_dict())
    for c in (merged, loaded):
        for x in xs[8:]: c.update_statistics('m', None, x)
    ref = StatisticsCollector(StatisticsConfig(**FULL)).merge(a).merge(b)
    for x in xs[8:]: ref.update_statistics('m', None, x)
    assert _read(merged) == _read(ref) and _read(loaded) == _read(ref)

# ----- hooks that copy, save and pause

def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))

def _hooks(model): return [f for m in model.modules() for f in m._forward_hooks.values()]

def _saved(model):
    buf = io.BytesIO(); torch.save(model, buf); buf.seek(0)
    return torch.load(buf, weights_only=False)

def test_an_attached_model_copies_and_saves_and_its_copies_record_nothing():
    model, x = _net(), torch.randn(5, 6)
    hook = ActivationStatisticsHook()
    hooks = hook.attach(model)
    assert len(_hooks(model)) == 3 and all(isinstance(f, HookFn) for f in _hooks(model))   # the two layers' and the model's (its batches), through HookFn, every one
    model(x)
    before = _read(hook)
    for twin in (copy.deepcopy(model), _saved(model)):
        assert torch.equal(twin(x), model(x))        # the twin computes the same, and records nothing anywhere
    assert hook.call_count == 3 * 2 and hook.get_statistics('0').n_updates == 3      # the original's three forwards only
    hooks.remove()
    assert _hooks(model) == []
    for twin in (copy.deepcopy(model), _saved(model)): assert torch.equal(twin(x), model(x))
    assert _read(hook)[1]['0'][1]['0'].count == 3 * 5 * 8 and before[1]['0'][1]['0'].count == 5 * 8

def test_a_hand_registered_collector_copies_and_saves():
    "Registered by hand (the usual API), the hook is the collector itself: the model's copy carries a copy of it, the original is untouched."
    model, x = _net(), torch.randn(5, 6)
    hook = ActivationStatisticsHook()
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear): m._hook_name = name; m.register_forward_hook(hook)
    model(x)
    before = _read(hook)
    for twin in (copy.deepcopy(model), _saved(model)): assert torch.equal(twin(x), model(x))
    assert hook.call_count == 3 * 2 and hook.get_statistics('2').n_updates == 3 and _read(hook) != before

@pytest.mark.parametrize('how', ['attach', 'by hand'])
def test_nothing_is_counted_while_recording_is_paused(how):
    model, x = _net(), torch.randn(5, 6)
    hook = ActivationStatisticsHook(StatisticsConfig(**FULL))
    if how == 'attach': hooks = hook.attach(model)
    else:
        for name, m in model.named_modules():
            if isinstance(m, nn.Linear): m._hook_name = name; m.register_forward_hook(hook)
    model(x)
    before, calls = _read(hook), hook.call_count
    with paused_recording():
        model(x); model(torch.randn(7, 6))
    assert (_read(hook), hook.call_count) == (before, calls)
    model(x)
    assert hook.call_count == calls + 2 and hook.get_statistics('0').n_updates == 2

# ----- the user's tensors stay as they were

def _bits(t): return t.detach().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).clone()

def _odd_tensors(dtype):
    "Tensors a hook may see: NaN/Inf/-0. and subnormal values, a transposed view, a channels_last 4-d one, a broadcast (stride 0) one, a large sampled one."
    g = torch.Generator().manual_seed(2)
    a = torch.randn(30, 40, generator=g, dtype=torch.float64)
    a[0, :4] = torch.tensor([math.nan, math.inf, -math.inf, -0.]); a[1, :2] = torch.tensor([1e-310, -1e-40])
    big = torch.randn(2, 4, 30, 30, generator=g, dtype=torch.float64) * 1e3
    return [a.to(dtype), a.to(dtype).t(), big.to(dtype).to(memory_format=torch.channels_last),
            torch.randn(1, 50, generator=g).to(dtype).expand(400, 50), (torch.randn(20, 1000, generator=g) * 50).to(dtype)]

@pytest.mark.parametrize('dtype', DTYPES, ids=[str(d)[6:] for d in DTYPES])
@pytest.mark.parametrize('cfg', list(CONFIGS))
def test_statistics_never_write_into_the_tensors_they_read(dtype, cfg, fused):
    ts = _odd_tensors(dtype)
    bits = [_bits(t) for t in ts]
    c = StatisticsCollector(StatisticsConfig(**CONFIGS[cfg]))
    for _ in range(2):                              # the second time, every buffer is warm
        for i, t in enumerate(ts): c.update_statistics(f'm{i}', t, {'out': t, 'again': t})
    c.get_all_statistics(); c.export_statistics(); c.export_statistics('quantization')
    for t, b in zip(ts, bits): assert torch.equal(_bits(t), b)

@pytest.mark.parametrize('dtype', DTYPES, ids=[str(d)[6:] for d in DTYPES])
def test_a_hooked_training_step_is_bit_identical(dtype, fused):
    "Inputs, every layer's output, the loss and the gradients of a training step with the hooks attached, against the same step without."
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 600), nn.ReLU(), nn.Linear(600, 64), nn.Tanh(), nn.Linear(64, 5)).to(dtype)
    x = (torch.randn(48, 40) * 4).to(dtype); x[0, 0] = -0.; y = torch.randint(0, 5, (48,))
    def step(with_stats):
        m = copy.deepcopy(model); seen = []
        for layer in m: layer.register_forward_hook(lambda mod, i, o: seen.append((i[0], o)))   # keeps the very tensors
        hook = ActivationStatisticsHook(StatisticsConfig(**FULL))
        handles = hook.attach(m, layers=lambda mod: not isinstance(mod, nn.Sequential)) if with_stats else []
        xin = x.clone()
        loss = F.cross_entropy(m(xin).float(), y); loss.backward()
        if with_stats: assert hook.get_statistics('1').n_updates == 1; handles.remove()
        return [_bits(xin), _bits(loss)] + [_bits(t) for io_ in seen for t in io_] + [_bits(p.grad) for p in m.parameters()]
    for a, b in zip(step(True), step(False)): assert torch.equal(a, b)
