"""The Triton statistics kernel (`miniai.triton_kernel`) against exact rational arithmetic and the other two paths, run on CPU
tensors through Triton's interpreter (the same kernel a GPU compiles): counts, min and max exact, mean and m2 within 1e-12
relative of the rational truth, on structured tensors (NaN columns and strides, heads unlike tails, columns unlike each other,
NaN/Inf mixes, all-NaN, single values, huge and tiny magnitudes, every float type), on every layout (channels_last, transposed,
sliced, expanded, offset), with the histogram and the sketch of every value equal to the loops' and the torch ops'. Then the
recorders on that path: the collector's sketches fed every value (the same counts, percentiles and bounds as the loops' feed of
every value), and a hook call's launches (ActivationStats 2, the collector 4 for an input and an output) with no host sync.

Every test here runs in `make test` on CPU tensors (about 30 s: the interpreter is slow, so the tensors hold a few thousand values, and tiles of
256 values over 3 programs make the in-program and the cross-program merges both run), and one more compiles the kernels for
an sm_90 GPU without one; where CUDA is available, each also runs on CUDA tensors with the compiled kernel (`-k cuda`
selects those). Each test sets `TRITON_INTERPRET=1` for itself: the kernels use only Triton's builtins, so the
interpreter runs them whether Triton was imported with it or not."""
import math, os, sys, subprocess
from fractions import Fraction

import numpy as np, torch, pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from miniai.kernel import FIELDS, batch_moments, use_kernel, loops_for, moments_torch, sample_bins_torch, sample_bins
from miniai.testing import count_syncs
import miniai.triton_kernel as TK
from _exact import exact_stats
from miniai.triton_kernel import triton_pass, triton_moments, triton_moments_hist, triton_moments_sketch, triton_serves, count_launches

pytestmark = [pytest.mark.skipif(TK.triton is None, reason="no Triton in this torch"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]   # numpy, in the interpreter: lanes of a `where` not taken

@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    "CPU tensors served by Triton's interpreter during each test (and not after it)."
    monkeypatch.setenv('TRITON_INTERPRET', '1')

DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])   # cpu: the interpreter; cuda: the compiled kernel
ON = pytest.mark.parametrize('dev', DEVICES)
SMALL = dict(block=256, programs=3)      # many tiles per program and several programs: both merges run
EXACT = [FIELDS.index(k) for k in FIELDS if k not in ('mean', 'm2')]


def truth(x, low=0.25, high=10.): return exact_stats(x, low, high, bounds_as_values=True)   # Triton compares in the values' type

def check(row, r):
    "Counts, min and max exact; the mean within 1e-12 relative (or float64 rounding of the sum, when the values cancel); m2 within 1e-12 relative."
    d = dict(zip(FIELDS, row.tolist()))
    keys = ('count', 'nan', 'posinf', 'neginf', 'zeros', 'low', 'high')
    assert [d[k] for k in keys] == [r[k] for k in keys]
    if not r['count']:
        assert (d['min'], d['max'], d['mean'], d['m2']) == (math.inf, -math.inf, 0., 0.); return
    assert (Fraction(d['min']), Fraction(d['max'])) == (r['min'], r['max'])
    n, tiny = r['count'], Fraction(2.**-1074)
    assert abs(Fraction(d['mean']) - r['mean']) <= max(Fraction(1, 10**12) * abs(r['mean']), Fraction(1, 10**14) * r['abs'] / n) + tiny, (d['mean'], float(r['mean']))
    if r['min'] == r['max']: assert d['m2'] == 0 and Fraction(d['mean']) == r['min']; return      # a constant: exactly
    if r['m2'] > Fraction(2**1023): assert d['m2'] >= 2.**1020; return                            # beyond float64
    assert abs(Fraction(d['m2']) - r['m2']) <= Fraction(1, 10**12) * r['m2'] + 4 * tiny * n, (d['m2'], float(r['m2']))


def structured():
    g = torch.Generator().manual_seed(40)
    def rn(*s, dtype=torch.float32): return torch.randn(*s, generator=g, dtype=dtype)
    y = rn(800, 4) + 5; y[:, 0] = math.nan; yield 'NaN column', y
    for k in (2, 3, 255, 257):
        t = rn(3000); t[::k] = math.nan; yield f'NaN every {k}', t
    t = torch.zeros(4000); t[2001:] = rn(1999) + 5; t[-7] = math.nan; yield 'head 0, tail 5', t
    for dtype, big in ((torch.float32, 1e4), (torch.float64, 1e8)):
        noise = rn(2000, dtype=dtype)
        yield f'head 0, tail large {dtype}', torch.cat([torch.zeros(1, dtype=dtype), big + noise])
        yield f'head large, tail small {dtype}', torch.cat([torch.full((1,), big, dtype=dtype), noise])
        yield f'NaN head, large tail {dtype}', torch.cat([torch.full((1,), math.nan, dtype=dtype), big + noise])
        yield f'columns unlike each other {dtype}', torch.stack([noise, big + noise], 1)
    t = torch.ones(3000); t[-1] = 3e38; yield 'outlier at the last index', t
    t = rn(3000).relu(); t[::3] = math.inf; t[1::7] = -math.inf; yield 'Inf both signs', t
    yield 'all NaN', torch.full((700,), math.nan)
    yield 'all Inf', torch.full((5,), math.inf)
    yield 'one value', torch.tensor([2.5])
    yield 'one NaN', torch.tensor([math.nan])
    yield 'constant', torch.full((3001,), -12345.678)
    yield 'float64 mean 1e7', rn(3000, dtype=torch.float64) + 1e7
    yield 'float64 beyond float32', rn(3000, dtype=torch.float64) * 1e150
    yield 'float64 tiny', rn(3000, dtype=torch.float64) * 1e-150
    t = rn(3000, dtype=torch.float64) * 1e307; t[5] = 1.7e308; t[9] = -1.7e308; yield 'float64 at the edge', t
    yield 'float32 subnormals', rn(3000) * 1e-42
    t = (rn(3000) * 3).half(); t[::11] = math.nan; t[4] = math.inf; yield 'float16 with NaN/Inf', t
    t = (rn(3000) * 100 + 7).bfloat16(); t[::13] = 0; yield 'bfloat16', t
    yield 'float16 extremes', torch.tensor([65504., -65504., 6e-8, 1e-4, 0.] * 300, dtype=torch.float16)

CASES = list(structured())

@ON
@pytest.mark.parametrize('grid', [SMALL, {}], ids=['256x3', 'default'])
@pytest.mark.parametrize('case', range(len(CASES)), ids=[c[0] for c in CASES])
def test_structured_against_rationals(case, grid, dev):
    name, x = CASES[case]
    check(triton_pass(x.to(dev), 0.25, 10., **grid)[0], truth(x))


@ON
def test_equals_the_loops_and_the_torch_ops(dev):
    "Counts, min and max identical to the compiled loops' and the torch ops' on the same tensors; mean and m2 within 1e-12."
    for name, x in CASES[::3]:
        f = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        row = triton_moments(x.to(dev), 0.25, 10.).cpu()
        with use_kernel('loops'): loops = batch_moments(f).t
        torch_ = moments_torch(f.reshape(-1), 0.25, 10.)
        for other in (loops, torch_):
            assert row[EXACT].tolist() == other[EXACT].tolist(), name
            torch.testing.assert_close(row[4:6], other[4:6], rtol=1e-12, atol=1e-300, msg=name)


SPECIAL = {torch.float32: [3.4e38, -3.4e38, 1e38, 1e-45, -1e-45, 1e-38, 1e20, 1e-20, 0., -0.],
           torch.float64: [1.7e308, -1.7e308, 1e308, 5e-324, -5e-324, 1e-310, 1e154, 1e-160, 0.],
           torch.float16: [65504., -65504., 6e-8, 1e-4, 0.], torch.bfloat16: [3.38e38, -3.38e38, 1e-40, 1e20, 0.]}

def values(dtype):
    width = 64 if dtype == torch.float64 else 32
    finite = st.floats(allow_nan=False, allow_infinity=False, width=width)
    mixed = st.one_of(finite, st.sampled_from(SPECIAL[dtype]), st.sampled_from([math.nan, math.inf, -math.inf]), st.floats(-10, 10, width=width))
    return st.lists(mixed, min_size=1, max_size=120).map(lambda v: torch.tensor(v, dtype=torch.float64).to(dtype))

@ON
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=st.sampled_from(list(SPECIAL)).flatmap(values))
def test_random_values_against_rationals(x, dev):
    "Huge, tiny, subnormal, NaN and Inf values in every float type, in tiles of 16 over 3 programs."
    check(triton_pass(x.to(dev), 0.25, 10., block=16, programs=3)[0], truth(x))


def layouts(dev):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(4, 6, 10, 12, generator=g) * 2 + 1
    a[1, 2] = math.nan; a[0, 0, 0, 0] = -math.inf
    a, b, c = a.to(dev), torch.randn(1, 5, 1, generator=g).to(dev), torch.randn(3, 4, 5, 6, 7, generator=g).to(dev)
    yield 'channels_last', a.to(memory_format=torch.channels_last), True
    yield 'channels_last bfloat16', a.bfloat16().to(memory_format=torch.channels_last), True
    yield 'transposed', a.reshape(24, 120).t(), True
    yield 'offset', a.reshape(-1)[17:], True
    yield 'every third column', a.reshape(24, 120)[:, ::3], False
    yield 'a crop of channels_last', a.to(memory_format=torch.channels_last)[:, :, 2:8, 1:11], False
    yield 'expanded', b.expand(7, 5, 9), False
    yield '5 dims with gaps (one copy)', c[:, ::2, :, ::2, :], False

LAYOUTS = [name for name, _, _ in layouts('cpu')]

@ON
@pytest.mark.parametrize('case', range(len(LAYOUTS)), ids=LAYOUTS)
def test_every_layout_reads_every_value(case, dev):
    "A tensor whose values fill their memory is read as its storage, any other through its strides: the same statistics as its contiguous copy."
    name, x, dense = list(layouts(dev))[case]
    assert TK._dense(x) == dense
    if not dense and x.ndim <= 4: assert TK._strides(x) is not None
    row, hist = triton_pass(x, 0.25, 10., bins=40, **SMALL)
    check(row, truth(x))
    c = x.cpu().contiguous().reshape(-1)
    assert hist.tolist() == sample_bins_torch(c.float() if c.dtype == torch.bfloat16 else c, 40, 10.).tolist()


@pytest.mark.parametrize('dtype,bins,high', [(torch.float32, 40, 10.), (torch.float32, 30, 7.), (torch.float64, 40, 10.),
                                             (torch.bfloat16, 40, 10.), (torch.float16, 17, 3.3)])
@ON
def test_histogram_bins_every_value(dtype, bins, high, dev):
    "The |x| histogram of every value equals the torch ops' (and the loops') bins of every value, NaN and ±Inf in the top bin."
    g = torch.Generator().manual_seed(bins)
    x = (torch.randn(3000, generator=g) * high / 2).to(dtype)
    x[::17] = math.nan; x[5] = math.inf; x[6] = -math.inf; x[100:130] = 0
    row, hist = triton_moments_hist(x.to(dev), high / bins, high, bins)
    f = x.float() if dtype in (torch.float16, torch.bfloat16) else x
    assert hist.dtype == torch.int64 and hist.shape == (bins + 2,)
    assert hist.tolist() == sample_bins_torch(f, bins, high).tolist()
    with use_kernel('loops'): assert hist.tolist() == K_sample_bins(f, bins, high).tolist()
    assert hist.sum().item() == x.numel() and hist[-1].item() == 0
    check(row, truth(x, high / bins, high))

def K_sample_bins(f, bins, high): return sample_bins(f, bins, high)


@ON
@pytest.mark.parametrize('level', [0, 2])
def test_sketch_buckets_equal_the_loops(level, dev):
    "Every finite value into the sketch's buckets, weight 1, added to what the counts held: the same counts as the compiled loops give."
    from miniai.sketch import QuantileSketch, _skp
    g = torch.Generator().manual_seed(level)
    x = torch.randn(2500, generator=g) * torch.logspace(-12, 12, 2500, dtype=torch.float32)
    x[::9] = 0; x[::31] = math.nan; x[7] = math.inf; x[8] = -math.inf
    before = torch.rand(2 * QuantileSketch(level=level).k + 1, generator=g, dtype=torch.float64).round()
    counts = before.clone().to(dev)
    row = triton_moments_sketch(x.to(dev), 0.25, 10., counts, _skp(level))
    counts = counts.cpu()
    want = before.clone()
    with use_kernel('loops'): loops_for(x)['sketch'](x.numpy(), _skp(level), want.numpy())
    assert counts.tolist() == want.tolist()
    assert (counts - before).sum().item() == torch.isfinite(x).sum().item()
    check(row, truth(x))
    counts = counts.to(dev)
    row2, hist = triton_moments_sketch(x.double().to(dev), 0.25, 10., counts, _skp(level), bins=40)    # float64 values, with the histogram
    assert (counts.cpu() - want).tolist() == (want - before).tolist()
    assert hist.sum().item() == x.numel()


@ON
def test_fields_not_asked_read_nan(dev):
    x = torch.tensor([0., 1., -3., 20., math.nan], device=dev)
    d = dict(zip(FIELDS, triton_moments(x, 0.25, 10., zeros=False, ranges=False, minmax=False).tolist()))
    assert all(math.isnan(d[k]) for k in ('zeros', 'low', 'high', 'min', 'max'))
    assert (d['count'], d['nan'], d['mean']) == (4, 1, 4.5)
    d = dict(zip(FIELDS, triton_moments(x, 0.25, 10.).tolist()))
    assert (d['zeros'], d['low'], d['high'], d['min'], d['max']) == (1, 1, 1, -3., 20.)


@ON
def test_two_launches_no_sync_inputs_untouched(dev):
    x = torch.randn(2, 3, 20, 20, device=dev).to(memory_format=torch.channels_last)
    x[0, 0, 0, 0] = math.nan
    keep = x.clone()
    with count_launches() as cl, count_syncs() as cs: triton_pass(x, 0.25, 10., bins=40); triton_moments(x.half(), 0.25, 10.)
    assert (cl.n, cs.n) == (4, 0)
    assert torch.equal(x.isnan(), keep.isnan()) and torch.equal(x.nan_to_num(), keep.nan_to_num())
    assert x.is_contiguous(memory_format=torch.channels_last)


def test_a_sketch_that_does_not_fit_is_refused():
    from miniai.sketch import QuantileSketch, _skp
    x, counts = torch.randn(100), QuantileSketch(level=0).counts
    for bad in (counts.float(), counts[:-1], counts[::2], torch.zeros(2 * QuantileSketch(level=2).k + 1, dtype=torch.float64)):
        with pytest.raises(ValueError, match="sketch's `counts`"): triton_moments_sketch(x, 0.25, 10., bad, _skp(0))
    assert counts.sum() == 0                                   # nothing was added anywhere


def test_serves_what_it_can(monkeypatch):
    assert not triton_serves(torch.arange(3)) and not triton_serves(None) and triton_serves(torch.ones(3))
    with pytest.raises(TypeError, match='float tensor'): triton_pass(torch.arange(3), 0.25, 10.)
    monkeypatch.delenv('TRITON_INTERPRET')
    assert triton_serves(torch.ones(3)) == TK._interpreting()     # CPU tensors only in the interpreter


COMPILE = r"""
import inspect, sys, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import miniai.triton_kernel as TK
assert not TK._interpreting()
def signature(fn, types, consts):
    sig = {p: types.get(p, '*fp64' if p.endswith('_ptr') else 'i64') for p in inspect.signature(fn.fn).parameters}
    sig.update({c: 'constexpr' for c in consts})
    return sig
cases = [(TK._pass_kernel, {'x_ptr': '*bf16', 'hist_ptr': '*i32'}, dict(IS_F64=False, IS_BF16=True, DENSE=True, HIST=True, SKETCH=False, HIST_F32=True)),
         (TK._pass_kernel, {'x_ptr': '*fp32', 'hist_ptr': '*i32'}, dict(IS_F64=False, IS_BF16=False, DENSE=False, HIST=True, SKETCH=False, HIST_F32=False)),
         (TK._pass_kernel, {'x_ptr': '*fp64', 'hist_ptr': '*i32'}, dict(IS_F64=True, IS_BF16=False, DENSE=True, HIST=False, SKETCH=True, HIST_F32=False)),
         (TK._merge_kernel, {'hist_ptr': '*i32', 'hout_ptr': '*i64'}, dict(P=1024, HIST=True, NB=64, NOUT=42, CH=16, SKETCH=True, ZEROS=True, RANGES=True, MINMAX=True))]
for fn, types, consts in cases:
    if fn is TK._pass_kernel: consts = dict(consts, BLOCK=TK._BLOCK, NB=64, TOP=40)
    k = triton.compile(ASTSource(fn=fn.compiled, signature=signature(fn, types, consts), constexprs=consts), target=GPUTarget('cuda', 90, 32),
                       options=dict(num_warps=TK._WARPS if fn is TK._pass_kernel else 4))
    assert k.asm['cubin'], fn
print('compiled', len(cases))
"""

def test_compiles_for_a_gpu():
    "The kernels compile for an H100/H200 (sm_90, through Triton's own ptxas) without a GPU: the interpreter runs Python, so this is what catches code only the compiler refuses. In a process without the interpreter."
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    r = subprocess.run([sys.executable, '-c', COMPILE], env=env, capture_output=True, text=True, timeout=300)
    if r.returncode and ('ptxas' in r.stderr and 'not found' in r.stderr or 'No module named' in r.stderr): pytest.skip(r.stderr[-300:])
    assert r.returncode == 0 and 'compiled 4' in r.stdout, r.stderr[-3000:]


# ----- the recorders on the Triton path: the collector's sketch fed every value, and the launches of a hook call

def recorded(dtype, dev='cpu'):
    "Structured tensors of `dtype`: a NaN column, every third column, a crop of a channels_last batch (read through strides), a head of zeros before a large tail, and one of more values than the loops sample (16,384) with NaN and ±Inf."
    g = torch.Generator().manual_seed(7)
    def rn(*s, scale=1.): return (torch.randn(*s, generator=g) * scale).to(dtype).to(dev)
    a = rn(300, 8, scale=3.) + 1; a[:, 2] = math.nan
    b = rn(60, 90, scale=4.)[:, ::3]
    c = rn(4, 6, 12, 10, scale=2.).to(memory_format=torch.channels_last)[:, :, 2:9, 1:8]
    d = torch.cat([torch.zeros(500, dtype=dtype, device=dev), rn(2500, scale=1e3) + 5e3])
    e = rn(20_000).exp(); e[::97] = math.inf; e[5::101] = -math.inf; e[7::89] = math.nan
    assert not b.is_contiguous() and not TK._dense(c)
    return [a, b, c, d, e]

PCTS = [0, 0.1, 1, 25, 50, 75, 99, 99.9, 100]

def collect(xs, kernel, exact=False):
    "A default-sized collector (percentiles from the sketch alone, its histogram) fed each of `xs` as a module's input and output, and all of them as one more module's, with `kernel`."
    from miniai.statistics import StatisticsCollector, StatisticsConfig
    c = StatisticsCollector(StatisticsConfig(collect_percentiles=PCTS, collect_histogram=True, max_samples=None, collect_sparsity=True, exact=exact))
    with use_kernel(kernel):
        for i, x in enumerate(xs): c.update_statistics(f'm{i}', x, x); c.update_statistics('all', x, x)
    return c

def read(c):
    "Every stream's statistics as host dicts, and its sketch counts; mean and std apart (summed in another order)."
    res = {}
    for (name, kind, key), s in c._streams.items():
        d = s.read(c.config).to_dict()
        res[name, kind] = (s.sketch.counts.cpu(), {k: d.pop(k) for k in ('mean', 'std', 'errors')}, d)
    return res

@ON
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
def test_the_collectors_sketch_holds_every_value(dtype, dev):
    "The collector's streams under the Triton kernel: sketch counts equal the compiled loops' feed of every value (`exact=True`), so the percentiles, their bounds and the histogram are the same; nothing sampled, nothing pending, the sketch on the values' device."
    xs = recorded(dtype, dev)
    tri = collect(xs, 'triton')
    for s in tri._streams.values():
        assert s.sketch.counts.device == xs[0].device and s.sampling is None and s._pending == [] and s._whole == []
    loops = collect([x.cpu() for x in xs], 'loops', exact=True)
    sampled = collect([x.cpu() for x in xs], 'loops')
    assert any(s.sampling is not None for s in sampled._streams.values())     # the loops sample the largest tensor unless `exact`
    got, want = read(tri), read(loops)
    assert got.keys() == want.keys()
    for k in got:
        (cg, mg, dg), (cw, mw, dw) = got[k], want[k]
        assert torch.equal(cg, cw), k
        assert cg.sum().item() == dg['count'] > 0, k
        assert dg == dw, k
        assert 'percentiles' not in dg['estimated'] and dg['histogram']['sampling_error'] == 0, k
        for f in ('mean', 'std'): assert math.isclose(mg[f], mw[f], rel_tol=1e-12), (k, f)


@ON
def test_a_sketch_fed_by_the_triton_pass_merges_saves_and_loads(dev, tmp_path):
    "A collector fed on the Triton path (its sketches' counts on the values' device) merges with one fed by the loops (tensors small enough to be taken whole), and saves and loads: the same percentiles as one collector fed every value by the loops. A `SketchRecorder` made on the CPU moves its counts to the values' device at its first record, and merges."
    from miniai.statistics import StatisticsCollector
    from miniai.sketch import SketchRecorder
    xs = recorded(torch.float32, dev)
    a, b = collect([xs[0], xs[1], xs[4]], 'triton'), collect([xs[2].cpu(), xs[3].cpu()], 'loops')
    assert all(s.sampling is None for s in b._streams.values())
    a.merge(b)
    a.save(tmp_path / 's.json')
    back = StatisticsCollector.load(tmp_path / 's.json')
    want = collect([x.cpu() for x in xs], 'loops', exact=True).get_statistics('all').output_stats
    for c in (a, back):
        got = c.get_statistics('all').output_stats
        assert (got.percentiles, got.percentile_bounds, got.count, got.estimated) == (want.percentiles, want.percentile_bounds, want.count, [])
    r, ref = SketchRecorder(), SketchRecorder(exact=True)
    with use_kernel('triton'):
        for x in xs: r.record(x)
    with use_kernel('loops'):
        for x in xs: ref.record(x.cpu())
    assert r.sketch.counts.device == xs[0].device and r.sampling is None
    assert torch.equal(r.sketch.counts.cpu(), ref.sketch.counts)
    assert torch.equal(r.merge(ref).sketch.counts.cpu(), 2 * ref.sketch.counts)


@ON
def test_a_hook_call_launches_at_most_three_kernels_the_collectors_six_without_syncs(dev):
    "Per hook call on a small CNN, after the first forwards made the recorders: `ActivationStats` launches the Triton kernel twice and no torch op that launches (allocations launch nothing), the collector (input and output) four times; no host sync."
    import torch.nn as nn
    from miniai.activations import ActivationStats
    from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
    from miniai.testing import count_ops
    torch.manual_seed(0)
    # channels_last on a GPU, read in place; a CPU tensor is first flattened by the recorder (a copy when it is not contiguous),
    # before it knows that Triton's interpreter serves it
    fmt = torch.channels_last if dev == 'cuda' else torch.contiguous_format
    model = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, stride=2, padding=1)).to(dev).to(memory_format=fmt)
    x = torch.randn(8, 1, 28, 28, device=dev).to(memory_format=fmt)
    calls = 3
    for kind, attach, most in (('ActivationStats', lambda: ActivationStats(nn.Conv2d).attach(model), 3),
                               ('collector', lambda: ActivationStatisticsHook(StatisticsConfig()).attach(model, nn.Conv2d), 6)):
        with use_kernel('triton'), torch.no_grad():
            with count_ops() as plain: model(x)
            with attach():
                model(x); model(x)
                with count_launches() as cl, count_ops() as co, count_syncs() as cs: model(x)
        ops = list(co.ops)
        for o in plain.ops: ops.remove(o)
        launching = [o for o in ops if not o.startswith('empty')]
        assert cs.n == 0, (kind, cs.ops)
        assert cl.n == calls * (2 if kind == 'ActivationStats' else 4), kind
        assert launching == [] and cl.n / calls <= most, (kind, cl.n, launching)     # no torch op besides: no sample gathered, no copy
