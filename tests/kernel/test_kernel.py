"""Property tests of the statistics core (`batch_moments`, `Moments.fold`, `Recorder`) against references in exact rational
arithmetic and in numpy float64, on random tensors mixing huge, tiny, subnormal, NaN and Inf values in every float dtype, and on
structured tensors (NaN columns, NaN every k-th value, heads unlike tails, outliers at the last index, constants), with the
compiled CPU loops and with the torch ops that other devices run. Every number is exact or within its stated tolerance."""
import math
from fractions import Fraction
import numpy as np, torch, pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from miniai.kernel import batch_moments, row_moments, Moments, FIELDS, Recorder, use_kernel, sample_table, sample_bins, TABLE_ROWS, SAMPLE_RUN
from miniai.testing import count_syncs
from miniai.sketch import SketchRecorder
from _exact import exact_stats

settings.register_profile('kernel', max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile('kernel')

SPECIAL = {torch.float32: [3.4e38, -3.4e38, 1e38, 1e-45, -1e-45, 1e-38, 1e20, 1e-20, 0., -0.],
           torch.float64: [1.7e308, -1.7e308, 1e308, 5e-324, -5e-324, 1e-310, 1e154, 1e-160, 0.],
           torch.float16: [65504., -65504., 6e-8, 1e-4, 0.],
           torch.bfloat16: [3.38e38, -3.38e38, 1e-40, 1e20, 0.]}
BAD = [math.nan, math.inf, -math.inf]
PATHS = pytest.mark.parametrize('kernel', ['loops', 'torch'])

def values(dtype, min_size=1, max_size=200):
    width = {torch.float64: 64, torch.float32: 32}.get(dtype, 32)
    finite = st.floats(allow_nan=False, allow_infinity=False, width=width)
    mixed = st.one_of(finite, st.sampled_from(SPECIAL[dtype]), st.sampled_from(BAD),
                      st.floats(-10, 10, width=width))   # ordinary activations too
    return st.lists(mixed, min_size=min_size, max_size=max_size).map(lambda v: torch.tensor(v, dtype=torch.float64).to(dtype))

DTYPES = st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16])

def ref(x, low=0.25, high=10.): return exact_stats(x, low, high)   # the loops compare |x| with the bounds in float64

def check(m, r):
    "Counts, min and max exact; the mean within float64 rounding of the sum; m2 within 1e-9 relative (plus what float64 subnormals lose)."
    d = dict(zip(FIELDS, m.t.tolist()))
    assert [d[k] for k in ('count', 'nan', 'posinf', 'neginf', 'zeros', 'low', 'high')] == \
           [r[k] for k in ('count', 'nan', 'posinf', 'neginf', 'zeros', 'low', 'high')]
    if not r['count']:
        assert (d['min'], d['max']) == (math.inf, -math.inf); return
    assert (Fraction(d['min']), Fraction(d['max'])) == (r['min'], r['max'])
    n = r['count']
    tiny = Fraction(2.**-1074)
    assert abs(Fraction(d['mean']) - r['mean']) <= Fraction(1, 10**13) * r['abs'] / n + tiny, (d['mean'], float(r['mean']))
    if r['min'] == r['max']: assert d['m2'] == 0 and Fraction(d['mean']) == r['min']; return   # a constant
    if r['m2'] > Fraction(2**1023): assert d['m2'] >= 2.**1020; return                          # beyond float64
    assert abs(Fraction(d['m2']) - r['m2']) <= Fraction(1, 10**9) * r['m2'] + 4 * tiny * n, (d['m2'], float(r['m2']))

@given(DTYPES.flatmap(values), st.sampled_from(['loops', 'torch']))
def test_batch_moments_exact_against_rationals(x, kernel):
    with use_kernel(kernel): m = batch_moments(x)
    check(m, ref(x))
    d = m.to_dict()                                   # reading never raises, whatever the values
    assert d['nonfinite'] == d['nan'] + d['posinf'] + d['neginf']

@given(st.sampled_from([torch.float32, torch.float64]).flatmap(lambda d: st.tuples(values(d, 2), st.data())), st.sampled_from(['loops', 'torch']))
def test_fold_of_random_splits_is_one_batch(args, kernel):
    x, data = args
    cuts = sorted(data.draw(st.lists(st.integers(1, len(x) - 1), max_size=4, unique=True)))
    parts = [p for p in torch.tensor_split(x, cuts) if p.numel()]
    with use_kernel(kernel): m = Moments.stack([batch_moments(p) for p in parts]).fold()
    check(m, ref(x))

@given(st.sampled_from([torch.float32, torch.float64]).flatmap(lambda d: values(d, max_size=300)))
def test_loops_and_torch_ops_agree(x):
    "Counts, min and max identical on both paths; mean and m2 to rounding."
    with use_kernel('loops'): a = batch_moments(x).t
    with use_kernel('torch'): b = batch_moments(x).t
    exact = [FIELDS.index(k) for k in FIELDS if k not in ('mean', 'm2')]
    assert a[exact].tolist() == b[exact].tolist()
    for i in (FIELDS.index('mean'), FIELDS.index('m2')):
        if math.isfinite(b[i]): assert math.isclose(a[i], b[i], rel_tol=1e-9, abs_tol=1e-300) or abs(a[i] - b[i]) <= 1e-13 * x.double().nan_to_num(0, 0, 0).abs().max()


# ----- structured tensors, against numpy float64 (two-pass), both paths

def structured():
    g = torch.Generator().manual_seed(7)
    def rn(*s, dtype=torch.float32): return torch.randn(*s, generator=g, dtype=dtype)
    y = rn(5000, 4) + 5; y[:, 0] = math.nan; yield 'NaN column', y
    for k in (2, 3, 5, 8, 64, 4095, 4096, 4097, 20_000):
        t = rn(60_000); t[::k] = math.nan; yield f'NaN every {k}', t
    t = torch.zeros(300_000); t[200_001:] = rn(99_999) + 5; t[-7] = math.nan; yield 'head 0, tail 5', t
    t = torch.ones(100_000); t[-1] = 3e38; yield 'outlier at the last index', t
    t = rn(100_000); t[-1] = -3e38; yield 'negative outlier at the last index', t
    for mean in (1e3, 1e5, 1e7): yield f'mean/std {mean:g}', rn(100_000, dtype=torch.float64) + mean
    yield '1000 + 0.01 randn', rn(100_000) * 0.01 + 1000
    yield 'float64 beyond float32', rn(50_000, dtype=torch.float64) * 1e150   # m2 must fit a float64: std up to ~1e150
    yield 'float64 tiny', rn(50_000, dtype=torch.float64) * 1e-150
    yield 'subnormals', (rn(50_000) * 1e-42)
    t = rn(50_000).relu(); t[::3] = math.inf; t[1::7] = -math.inf; yield 'Inf both signs', t

CASES = list(structured())

@PATHS
@pytest.mark.parametrize('case', range(len(CASES)), ids=[c[0] for c in CASES])
def test_structured_against_numpy(case, kernel):
    name, x = CASES[case]
    with use_kernel(kernel): d = batch_moments(x).to_dict()
    a = x.double().numpy().ravel()
    fin = a[np.isfinite(a)]
    assert (d['count'], d['nan'], d['posinf'], d['neginf']) == (fin.size, np.isnan(a).sum(), (a == np.inf).sum(), (a == -np.inf).sum())
    assert (d['min'], d['max']) == (fin.min(), fin.max())
    assert (d['zeros'], d['low'], d['high']) == ((a == 0).sum(), (np.abs(fin) < 0.25).sum(), (np.abs(fin) >= 10).sum())
    mean = fin.mean()
    assert abs(d['mean'] - mean) <= 1e-6 * abs(mean) + 1e-12 * np.abs(fin).max(), (name, d['mean'], mean)
    with np.errstate(over='ignore'): std = (fin / np.abs(fin).max()).std(ddof=1) * np.abs(fin).max()   # no overflow
    assert abs(d['std'] - std) <= 1e-6 * std, (name, d['std'], std)

@PATHS
@pytest.mark.parametrize('v', [0., 1., -1., 12345.678, -3e38, 3e38, 1e-45, 1e-40], ids=str)
def test_constants_have_std_exactly_zero(v, kernel):
    for n in (1, 2, 4095, 4097, 100_000):
        with use_kernel(kernel): d = batch_moments(torch.full((n,), v)).to_dict()
        assert d['mean'] == torch.tensor(v).item() and d['m2'] == 0 and (n == 1 or d['std'] == 0), (v, n, d)
        fold = Moments.stack([batch_moments(torch.full((n,), v))] * 3).fold().to_dict()
        assert fold['m2'] == 0 and fold['mean'] == torch.tensor(v).item()

def test_row_moments_rows_are_batch_moments():
    a = torch.randn(7, 3000) * torch.arange(1., 8.)[:, None] + 100; a[3, ::5] = math.nan
    for kernel in ('loops', 'torch'):
        with use_kernel(kernel):
            rows, each = row_moments(a), torch.stack([batch_moments(r).t for r in a])
        torch.testing.assert_close(rows.t, each, rtol=1e-12, atol=0)


# ----- the recorder

@given(st.lists(st.tuples(st.integers(1, 40_000), st.sampled_from(['normal', 'nan', 'inf', 'huge', 'tiny', 'allnan', 'zeros', 'headtail'])),
                min_size=1, max_size=6), st.integers(0, 2**31), st.sampled_from(['loops', 'torch']))
@settings(max_examples=40)
def test_recorder_numbers_are_exact(batches, seed, kernel):
    "Per batch, with a small sample so most batches are sampled: NaN/Inf counts, means, stds and the dead and overflow fractions of every value; the histogram's first and last bins are the exact counts and it sums to the finite count; no host sync."
    g = torch.Generator().manual_seed(seed)
    rec, xs = Recorder(sample=256), []
    with count_syncs() as cs, use_kernel(kernel):
        for n, kind in batches:
            x = torch.randn(n, generator=g) * 3 + 1
            if kind == 'nan': x[::5] = math.nan
            if kind == 'inf': x[n // 2] = math.inf
            if kind == 'huge': x = x * 1e30
            if kind == 'tiny': x = x * 1e-30
            if kind == 'allnan': x[:] = math.nan
            if kind == 'zeros': x[:] = 0.
            if kind == 'headtail': x[: n // 2] = 0
            rec.record(x); xs.append(x)
    assert cs.n == 0
    for i, x in enumerate(xs):
        a = x.double().numpy(); fin = a[np.isfinite(a)]
        assert rec.nonfinite[i].item() == a.size - fin.size
        if not fin.size: assert math.isnan(rec.means[i]) and math.isnan(rec.dead[i]); continue
        assert abs(rec.means[i].item() - fin.mean()) <= 1e-9 * np.abs(fin).max()
        if fin.size > 1: assert abs(rec.stds[i].item() - fin.std(ddof=1)) <= 1e-9 * fin.std(ddof=1) + 1e-300
        assert rec.dead[i].item() == (np.abs(fin) < 0.25).sum() / fin.size
        assert rec.overflow[i].item() == (np.abs(fin) >= 10).sum() / fin.size
        h = rec.hists[i].double()
        assert h[0].item() == (np.abs(fin) < 0.25).sum() and h[-1].item() == (np.abs(fin) >= 10).sum()
        assert math.isclose(h.sum().item(), fin.size, rel_tol=1e-5)

def test_histogram_sample_spans_the_whole_tensor():
    "A tensor whose head is 0 and whose tail is 5 +- 1: the middle bins come from the tail, in every one of the sample tables."
    x = torch.zeros(16384 * 3 - 5); x[30_000:] = torch.randn(x.numel() - 30_000) * 0.5 + 5
    for row in range(TABLE_ROWS):
        idx = sample_table(x.numel(), 16384, x.device, SAMPLE_RUN)[row]
        assert idx.max() + SAMPLE_RUN >= x.numel() - 2 * x.numel() / (16384 // SAMPLE_RUN)
        raw = sample_bins(x, idx=idx, run=SAMPLE_RUN)
        assert raw[1:-2].sum() > 0.3 * 16384   # about 37% of the values are in the tail

def test_exact_recorder_bins_every_value():
    x = torch.randn(100_000) * 3
    rec = Recorder(exact=True); rec.record(x)
    ref = np.bincount(np.minimum(np.floor(np.abs(x.double().numpy()) * 4), 40).astype(int), minlength=41)
    assert rec.hists[0].tolist() == ref.tolist()

@PATHS
def test_run_wide_fold_equals_one_batch(kernel):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(int(n), generator=g) * (1 + i) + 1000 for i, n in enumerate(torch.randint(1, 50_000, (150,), generator=g))]
    xs[10][::3] = math.nan
    with use_kernel(kernel):
        run = Recorder(fold=True, zeros=True)
        run.fold_every = 7
        for x in xs: run.record(x)
        whole = batch_moments(torch.cat(xs)).to_dict()
    t = run.total.to_dict()
    for k in ('count', 'nan', 'zeros', 'low', 'high', 'min', 'max'): assert t[k] == whole[k], k
    assert math.isclose(t['mean'], whole['mean'], rel_tol=1e-12) and math.isclose(t['m2'], whole['m2'], rel_tol=1e-9)

def test_sketch_weights_sum_to_the_exact_count():
    "Sampled batches feed the sketch with weights: the sketch's total is the exact finite count, and its percentiles are near numpy's."
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(100_000, generator=g) for _ in range(8)]
    xs[3][::11] = math.nan
    run = SketchRecorder()
    for x in xs: run.record(x)
    run.flush()
    allx = torch.cat(xs).numpy(); fin = allx[np.isfinite(allx)]
    assert math.isclose(run.sketch.counts.sum().item(), fin.size, rel_tol=1e-9)
    k, w, w2 = run.sampling.tolist()
    assert 7 * 16384 < k <= 8 * 16384 and w2 >= w * w / k
    assert math.isclose(w, fin.size, rel_tol=1e-9)
    est = run.sketch.quantiles([5, 50, 95], float(fin.min()), float(fin.max()))
    ref = np.percentile(fin, [5, 50, 95])
    assert np.all(np.abs(np.array(est) - ref) <= 0.03 * np.abs(ref) + 0.02), (est, ref)


def test_hooks_on_the_device_path_never_sync():
    "With the torch ops a GPU runs (`use_kernel('torch')`): ActivationStats and the run-wide collector read nothing from the device over real training batches."
    import torch.nn.functional as F
    from torch import nn
    from miniai.datasets import fashion_dls
    from miniai.learner import Learner, TrainCB, Callback, CancelFitException, baseline_cnn, set_seed
    from miniai.activations import ActivationStats
    from miniai.statistics import StatisticsConfig, ActivationStatisticsHook
    class Stop(Callback):
        order = 10
        def after_batch(self, learn):
            if learn.iter == 20: raise CancelFitException()
    def run(kernel):
        set_seed(0)
        model = baseline_cnn()
        hook = ActivationStatisticsHook(StatisticsConfig(collect_input=False))
        with hook.attach(model, layers=nn.Conv2d), use_kernel(kernel), count_syncs() as cs:
            Learner(model, fashion_dls(256), F.cross_entropy, lr=0.1, cbs=[TrainCB(), Stop(), ActivationStats(nn.Conv2d)]).fit(1, valid=False)
        return cs.n
    assert run('torch') == run('loops') == 3   # the DataLoader's sampler reads 3 host values per epoch; the hooks none


class Emit(torch.nn.Module):
    "A layer whose output is a fixed structured tensor, whatever its input."
    def __init__(self, t): super().__init__(); self.t = t
    def forward(self, x): return self.t.clone()

@PATHS
def test_diagnose_reads_every_value(kernel):
    "Lesson 10's table on structured layers: a dead layer whose tail is alive, a NaN column, and an exploding outlier at the last index (the torch path too)."
    from miniai.activations import ActivationStats, get_min, main_recorder
    from miniai.learner import Learner, run_cbs
    g = torch.Generator().manual_seed(3)
    dead = torch.zeros(300_000); dead[243_000:] = torch.randn(57_000, generator=g) + 5; dead[-1] = math.nan
    nancol = torch.randn(5000, 4, generator=g) + 5; nancol[:, 0] = math.nan
    boom = torch.ones(100_000); boom[-1] = 3e38
    net = torch.nn.ModuleDict(dict(dead=Emit(dead), nancol=Emit(nancol), boom=Emit(boom)))
    a = ActivationStats(layers=list(net.values()))
    learn = Learner(net, [[(torch.zeros(1),)]], cbs=[a]); learn.model = net   # drive the hooks by hand
    run_cbs([a], 'before_fit', learn)
    for h, name in zip(a.hooks, net): h.name = name
    with use_kernel(kernel), count_syncs() as cs:
        for _ in range(3):
            run_cbs([a], 'before_batch', learn); [m(None) for m in net.values()]; run_cbs([a], 'after_batch', learn)
    run_cbs([a], 'cleanup_fit', learn)
    assert cs.n == 0
    rows = {r['layer']: r for r in a.diagnose()}
    fin = dead[dead.isfinite()].double()
    assert rows['dead']['dead'] == (fin.abs() < 0.25).double().mean().item() > 0.8 and 'dead' in rows['dead']['flags']
    assert get_min(a.hooks[0]).tolist() == [pytest.approx((fin.abs() < 0.25).double().mean().item(), rel=1e-7)] * 3
    assert rows['dead']['std'] == pytest.approx(fin.std().item(), rel=1e-9) and rows['dead']['nonfinite'] == 3
    f = nancol[:, 1:].double()
    assert rows['nancol']['mean'] == pytest.approx(f.mean().item(), rel=1e-12) and rows['nancol']['std'] == pytest.approx(f.std().item(), rel=1e-9)
    assert rows['boom']['std'] == pytest.approx(boom.double().std().item(), rel=1e-9)
    assert 'exploding' in rows['boom']['flags'] and 'vanishing' not in rows['boom']['flags']
    assert main_recorder(a.hooks[2]).moments.max.isnan().all()                  # lesson 10 reads no max: not computed
    r = Recorder(); r.record(boom); assert r.moments.max.tolist() == [boom[-1].item()]


@pytest.mark.parametrize('kernel', ['loops', 'torch'])
@pytest.mark.parametrize('nan_every', [2, 4096, 5000])
def test_blocks_with_nan_keep_a_far_mean_exact(kernel, nan_every):
    "A mean 1e8 stds from 0 (262145 ± 0.002), NaN in every block or some: the blocks read value by value merge as offsets from their first value, so m2 stays within 1e-12 of the rational one (it was 3e-10 off when such a block handed over its rounded mean)."
    x = torch.randn(12_000, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 2.**-9 + 262145.
    x[1::nan_every] = math.nan
    e = ref(x)
    with use_kernel(kernel): m = batch_moments(x)
    assert m.count.item() == e['count'] and m.nonfinite.item() == e['nan']
    assert abs(Fraction(m.m2.item()) - e['m2']) <= Fraction(1, 10**12) * e['m2']
    assert abs(Fraction(m.mean.item()) - e['mean']) <= Fraction(1, 10**12) * abs(e['mean'])
