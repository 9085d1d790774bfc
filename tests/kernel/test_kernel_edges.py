"""The statistics kernel at its edges: it never writes into the tensor it reads, on either path and in any float dtype or
layout, and a recording made under `torch.inference_mode()` (a calibration pass) leaves the kernel able to record outside it."""
import math
import pytest, torch
from torch import nn
from miniai.kernel import Recorder, batch_moments, row_moments, use_kernel, flat_float, sample_bins, sample_table, TABLE_ROWS, SAMPLE_RUN, loops_for, reset_kernel

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
PATHS = ['loops', 'torch']

def _values(shape, dtype, seed=0):
    "Signed values with a large-mean stripe, NaN, ±Inf and exact zeros: abs() or a scale written back would show."
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64) * 3
    flat = x.view(-1)
    flat[::7] = 0.; flat[1::11] += 40.
    if flat.numel() > 4: flat[2], flat[3], flat[4] = math.nan, math.inf, -math.inf
    return x.to(dtype)

def _layouts(dtype):
    yield 'tiny', _values((3,), dtype)
    yield 'under 16K', _values((8, 250), dtype)
    yield 'over 16K', _values((4, 8, 32, 32), dtype)
    yield 'transposed', _values((300, 100), dtype).t()
    yield 'channels_last', _values((4, 8, 24, 24), dtype).to(memory_format=torch.channels_last)
    yield 'strided slice', _values((2, 40_000), dtype)[:, ::3]

def _storage_bytes(x):
    "Every byte of `x`'s storage (the whole storage: a write anywhere in it shows, not only in `x`'s own elements)."
    return torch.empty(0, dtype=torch.uint8).set_(x.untyped_storage()).clone()

def _use_everything(x):
    "Each way the kernel reads a tensor: the per-batch, exact and run-wide recorders, the one pass, rows, the histogram bins."
    for r in (Recorder(), Recorder(exact=True), Recorder(fold=True, zeros=True)): r.record(x); r.total.to_dict()
    batch_moments(x); batch_moments(x, zeros=False, ranges=False, minmax=False)
    row_moments(x.reshape(x.shape[0], -1) if x.dim() > 1 else x[None])
    f = flat_float(x)
    sample_bins(f)
    if f.numel() > 64: sample_bins(f, idx=sample_table(f.numel(), 64, f.device, 16)[0], run=16)

@pytest.mark.parametrize('kernel', PATHS)
@pytest.mark.parametrize('dtype', DTYPES, ids=str)
def test_recording_leaves_the_tensor_bit_identical(dtype, kernel):
    with use_kernel(kernel):
        for name, x in _layouts(dtype):
            before, clone, ptr, stride = _storage_bytes(x), x.clone(), x.data_ptr(), x.stride()
            _use_everything(x)
            assert (x.data_ptr(), x.stride()) == (ptr, stride), name
            assert torch.equal(_storage_bytes(x), before), f"{name}: the kernel wrote into the tensor it read ({dtype})"
            assert torch.equal(x.isnan(), clone.isnan()) and torch.equal(x.nan_to_num(), clone.nan_to_num()), name

@pytest.mark.parametrize('kernel', PATHS)
def test_histogram_bins_of_a_float64_activation_leave_it_alone(kernel):
    "The reported case: a float64 tensor of up to 16K values binned whole; its values used to be replaced by |x|*4."
    x = torch.linspace(-5, 5, 1000, dtype=torch.float64)
    ref = x.clone()
    with use_kernel(kernel):
        r = Recorder(); r.record(x)
    assert torch.equal(x, ref)
    assert r.hists[0].sum().item() == 1000 and r.hists[0, 0].item() == (ref.abs() < 0.25).sum().item()

@pytest.mark.parametrize('kernel', PATHS)
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_a_hooked_backward_keeps_every_gradient(dtype, kernel):
    "A float64 model whose outputs and output gradients are recorded by a Recorder trains on the same gradients as without it."
    def run(hooked):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3)).to(dtype)
        x = torch.randn(50, 20, dtype=dtype, requires_grad=True)
        recs, hs = [], []
        if hooked:
            for l in m:
                r, g = Recorder(), Recorder(); recs += [r, g]
                hs.append(l.register_forward_hook(lambda mod, i, o, r=r: r.record(o)))
                hs.append(l.register_full_backward_hook(lambda mod, gi, go, g=g: g.record(go[0])))
        out = m(x)
        out.square().sum().backward()
        for h in hs: h.remove()
        assert all(len(r) == 1 for r in recs)
        return [out.detach(), x.grad] + [p.grad for p in m.parameters()]
    with use_kernel(kernel): hooked = run(True)
    for a, b in zip(hooked, run(False)): assert torch.equal(a, b)

def _record_all(x):
    rs = [Recorder(), Recorder(exact=True), Recorder(fold=True, zeros=True)]
    for r in rs: r.record(x)
    return [rs[0].moments.t, rs[0].hists, rs[1].hists, rs[2].total.t, batch_moments(x).t, row_moments(x.reshape(x.shape[0], -1)).t]

@pytest.mark.parametrize('kernel', PATHS)
@pytest.mark.parametrize('dtype', DTYPES, ids=str)
def test_a_recording_under_inference_mode_does_not_break_later_ones(dtype, kernel):
    "Record first under inference_mode (the kernel's buffers are made there), then outside, then under no_grad, then inside again: every result equals a fresh recording."
    xs = [_values((4, 8, 24, 24), dtype, seed=1), _values((4, 8, 24, 24), dtype, seed=2).to(memory_format=torch.channels_last),
          _values((300, 100), dtype, seed=3).t()]
    with use_kernel(kernel):
        want = [_record_all(x) for x in xs]
        reset_kernel()                                # the next tables are drawn under inference_mode
        for ctx in (torch.inference_mode, torch.enable_grad, torch.no_grad, torch.inference_mode):
            for x, w in zip(xs, want):
                with ctx(): got = _record_all(x)
                for a, b in zip(got, w): assert torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan()), ctx.__name__
        tables = [sample_table(x.numel(), 16384, 'cpu', run) for x in xs for run in (1, SAMPLE_RUN)]
        assert any(r is not None for t in tables for r in t.rows) and not any(r is not None and r.is_inference() for t in tables for r in t.rows)

def test_a_calibration_pass_then_training_through_hooks():
    "The reported case: a hooked model sees one forward under inference_mode, then trains; the hooks keep recording."
    reset_kernel()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    x = torch.randn(4, 3, 10, 10).to(memory_format=torch.channels_last)
    m(x)
    for path in PATHS:
        with use_kernel(path):
            recs = [Recorder() for _ in m]
            hs = [l.register_forward_hook(lambda mod, i, o, r=r: r.record(o)) for l, r in zip(m, recs)]
            with torch.inference_mode(): m(x.bfloat16().float())
            m(x).sum().backward()
            with torch.no_grad(): m(x)
            for h in hs: h.remove()
            assert [len(r) for r in recs] == [3] * 4
            a, b = recs[0].moments.t[1:3]                 # the training step and the no_grad pass saw the same tensor
            assert torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan())

@pytest.mark.parametrize('n,sample,run', [(1_605_632, 16384, 16), (100_000, 16384, 1), (16_385, 16384, 1), (3000, 64, 16), (65, 64, 1)])
def test_cpu_sample_tables_equal_the_torch_formula(n, sample, run):
    "The CPU draws its sample tables with numpy (one thread, in place), one row when first asked for; each row is bit for bit what the torch ops draw on other devices from its own seed, whatever order the rows are asked in."
    k = sample // run
    def ref(row):
        u = torch.rand(k, generator=torch.Generator().manual_seed(n * TABLE_ROWS + row), dtype=torch.float64)
        return ((torch.arange(k, dtype=torch.float64) + u) * ((n - run + 1) / k)).floor_().clamp_(0, n - run).long()
    reset_kernel()
    tab = sample_table(n, sample, 'cpu', run)
    assert tab.rows == [None] * TABLE_ROWS            # nothing drawn until asked for
    with use_kernel('loops'):                              # the compiled loops sample it: one row at a time
        assert loops_for(torch.ones(2)) is not None
        assert torch.equal(tab[24], ref(24)) and sum(r is not None for r in tab.rows) == 1
    reset_kernel()
    with use_kernel('torch'):                             # the torch ops (what a GPU runs): every row at the first use, none later
        t2 = sample_table(n, sample, 'cpu', run)
        assert torch.equal(t2[3], ref(3)) and all(r is not None for r in t2.rows)
    whole = tab.stack()
    assert whole.dtype == torch.int64 and whole.shape == (TABLE_ROWS, k) and int(whole.max()) <= n - run and int(whole.min()) >= 0
    assert all(torch.equal(whole[r], ref(r)) for r in range(TABLE_ROWS))
    assert sample_table(n, sample, 'cpu', run) is t2 and not torch.equal(whole[0], whole[1])
