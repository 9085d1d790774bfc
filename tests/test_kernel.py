"""Property tests of lesson 10's statistics kernel (`count_finite`, `moments`, `merge_moments`, `StatsRecorder`) against an exact
reference in rational arithmetic: random tensors mixing huge, tiny, subnormal, NaN and Inf values, in every float dtype,
random batch splits. Counts must be exact; means and sums of squares within the rounding of the dtype they are summed in."""
import math
from fractions import Fraction
import numpy as np, torch, pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from miniai.kernel import count_finite, moments, merge_moments, moments_dict, StatsRecorder, count_syncs, fused_kernel
import miniai.kernel as K

settings.register_profile('kernel', max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile('kernel')

SPECIAL = {torch.float32: [3.4e38, -3.4e38, 1e38, 1e-45, -1e-45, 1e-38, 1e20, 1e-20, 0., -0.],
           torch.float64: [1.7e308, -1.7e308, 1e308, 5e-324, -5e-324, 1e-310, 1e154, 1e-160, 0.],
           torch.float16: [65504., -65504., 6e-8, 1e-4, 0.],
           torch.bfloat16: [3.38e38, -3.38e38, 1e-40, 1e20, 0.]}
BAD = [math.nan, math.inf, -math.inf]

def values(dtype, min_size=1, max_size=200):
    width = {torch.float64: 64, torch.float32: 32}.get(dtype, 32)
    finite = st.floats(allow_nan=False, allow_infinity=False, width=width)
    mixed = st.one_of(finite, st.sampled_from(SPECIAL[dtype]), st.sampled_from(BAD),
                      st.floats(-10, 10, width=width))   # ordinary activations too
    return st.lists(mixed, min_size=min_size, max_size=max_size).map(lambda v: torch.tensor(v, dtype=torch.float64).to(dtype))

DTYPES = st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16])

def _float(q):
    try: return float(q)
    except OverflowError: return math.inf if q > 0 else -math.inf

def ref(x):
    "Exact: finite count, NaN/Inf count, mean, m2, min, max, sum |x|, sum x^2 of the finite values (as the kernel sees them)."
    v = x.double().tolist()   # half types are upcast exactly
    f = [Fraction(a) for a in v if math.isfinite(a)]
    if not f: return dict(n=0, bad=len(v))
    mean = sum(f) / len(f)
    return dict(n=len(f), bad=len(v) - len(f), mean=mean, m2=sum((a - mean)**2 for a in f), min=min(f), max=max(f),
                abs=sum(abs(a) for a in f), sq=sum(a*a for a in f))

def eps_of(x, precise):
    "Relative rounding bound of the kernel's sums for `x` (half types are summed in float32)."
    return 1e-13 if precise or x.dtype == torch.float64 else 1e-6

def check(m, r, eps):
    n, bad, mean, m2, mn, mx = m
    assert (n, bad) == (r['n'], r['bad'])
    if not r['n']: return
    assert (Fraction(mn), Fraction(mx)) == (r['min'], r['max'])
    # the mean within eps of the mean |x|; m2 within eps of the sum of squares (both exact references)
    assert abs(Fraction(mean) - r['mean']) <= Fraction(eps) * r['abs'] / r['n'] + Fraction(2.**-1074), (mean, _float(r['mean']))
    if math.isinf(m2): assert Fraction(eps) * r['sq'] > Fraction(2**1023) or r['m2'] > Fraction(2**1023); return   # beyond float64
    assert abs(Fraction(m2) - r['m2']) <= Fraction(eps) * r['sq'] + Fraction(2.**-1074) * r['n'], (m2, _float(r['m2']))

@given(DTYPES.flatmap(values), st.booleans())
def test_moments_exact_counts_and_moments(x, precise):
    m = moments(x, precise=precise).tolist()
    assert isinstance(count_finite(x.float() if x.dtype in (torch.float16, torch.bfloat16) else x).item(), float)
    check(m, ref(x), eps_of(x, precise))
    d = moments_dict(torch.tensor(m, dtype=torch.float64))   # reading never raises, whatever the values
    assert d['count'] == m[0] and d['nonfinite'] == m[1]

@given(st.sampled_from([torch.float32, torch.float64]).flatmap(lambda d: st.tuples(values(d, 2), st.data())))
def test_merge_of_random_splits_is_one_batch(args):
    x, data = args
    cuts = sorted(data.draw(st.lists(st.integers(1, len(x) - 1), max_size=4, unique=True)))
    parts = [p for p in torch.tensor_split(x, cuts) if p.numel()]
    merged = moments(parts[0], precise=True)
    for p in parts[1:]: merged = merge_moments(merged, moments(p, precise=True))
    r = ref(x)
    check(merged.tolist(), r, 1e-12)

def test_count_finite_is_exact_beyond_float32_integers():
    x = torch.zeros(2**24 + 3); x[::7] = math.nan; x[5] = math.inf
    assert count_finite(x).item() == x.numel() - int((~torch.isfinite(x)).sum())

@given(st.lists(st.tuples(st.integers(1, 300), st.sampled_from(['normal', 'nan', 'inf', 'huge', 'tiny', 'allnan', 'zeros'])),
                min_size=1, max_size=8), st.integers(0, 2**31), st.booleans())
@settings(max_examples=60)
def test_recorder_counts_exact_moments_exact_or_flagged(batches, seed, fused):
    "Per batch: the NaN/Inf count is exact; mean and std are exact unless flagged as estimated, and estimated ones lie within their bound; with the CPU one-pass kernel and with the torch ops a GPU runs."
    g = torch.Generator().manual_seed(seed)
    rec, xs = StatsRecorder(sample=64), []   # a small sample, so that most batches take the sampled path
    with count_syncs() as cs, fused_kernel(fused):
        for n, kind in batches:
            x = torch.randn(n, generator=g) * 3 + 1
            if kind == 'nan': x[::5] = math.nan
            if kind == 'inf': x[n // 2] = math.inf
            if kind == 'huge': x = x * 1e30
            if kind == 'tiny': x = x * 1e-30
            if kind == 'allnan': x[:] = math.nan
            if kind == 'zeros': x[:] = 0.
            rec.record(x); xs.append((x, kind))
    assert cs.n == 0
    means, stds, est, err = rec.means.double(), rec.stds.double(), rec.estimated, rec.errors
    for i, (x, kind) in enumerate(xs):
        f = x[torch.isfinite(x)].double()
        assert rec.nonfinite[i].item() == x.numel() - f.numel()
        if kind in ('normal', 'zeros') or x.numel() <= 64: assert not est[i], (i, kind)   # healthy batches are never estimated
        if kind == 'huge' and fused: assert not est[i], i   # float64 sums hold squares of 1e30
        if not f.numel(): assert math.isnan(means[i]); continue
        tm, ts = f.mean().item(), (f.std().item() if f.numel() > 1 else math.nan)
        scale = f.abs().max().item()
        if not est[i]:
            assert abs(means[i] - tm) <= 1e-5 * scale, (i, kind, means[i], tm)
            if f.numel() > 1: assert abs(stds[i] - ts) <= 1e-3 * ts + 1e-5 * scale, (i, kind, stds[i], ts)
        else:   # a statistical bound (3 standard errors, see test_estimated_bounds_are_calibrated): far outside it is a bug
            assert abs(means[i] - tm) <= 3 * err['mean'][i] + 1e-6 * scale, (i, kind, means[i], tm, err['mean'][i])
            assert abs(stds[i] - ts) <= 3 * err['std'][i] + 1e-6 * scale, (i, kind, stds[i], ts, err['std'][i])
    # the histograms' finite bins add up to each batch's exact finite count
    fin = torch.tensor([int(torch.isfinite(x).sum()) for x, _ in xs], dtype=torch.float32)
    assert torch.allclose(rec.hists.sum(1), fin, rtol=1e-4)

def test_estimated_bounds_are_calibrated():
    "Batches with NaN: the estimated mean and std lie within their stated bound (3 standard errors) in at least 97% of batches."
    g = torch.Generator().manual_seed(0)
    rec, xs = StatsRecorder(sample=1024), []
    for i in range(300):
        x = torch.randn(8192, generator=g) * (1 + i % 7) + (i % 5) - 2
        x[torch.randperm(8192, generator=g)[:400]] = math.nan
        rec.record(x); xs.append(x[torch.isfinite(x)].double())
    assert rec.estimated.all()
    err = rec.errors
    inside_mean = [abs(rec.means[i].item() - f.mean().item()) <= err['mean'][i].item() for i, f in enumerate(xs)]
    inside_std = [abs(rec.stds[i].item() - f.std().item()) <= err['std'][i].item() for i, f in enumerate(xs)]
    assert sum(inside_mean) >= 0.97 * len(xs) and sum(inside_std) >= 0.97 * len(xs), (sum(inside_mean), sum(inside_std))
    assert rec.nonfinite.tolist() == [400] * 300


# ----- RunningStats: the run-wide recorder

from miniai.kernel import RunningStats

@given(DTYPES.flatmap(lambda d: values(d, max_size=120)), st.lists(st.integers(0, 120), max_size=5))
def test_running_stats_small_batches_exact(x, cuts):
    "Batches of at most `sample` values are kept whole: counts, min and max exact, mean and m2 as the reference, any split."
    cuts = sorted({min(c, len(x)) for c in cuts} | {0, len(x)})
    rs = RunningStats(sample=256)
    rs.flush_every = 3                                # several folds even for a few batches
    with count_syncs() as cs:
        for a, b in zip(cuts, cuts[1:]):
            if b > a: rs.record(x[a:b].float() if x.dtype in (torch.float16, torch.bfloat16) else x[a:b])
    assert cs.n == 0
    r, e = rs.read(), ref(x)
    assert (r['count'], r['nonfinite']) == (e['n'], e['bad'])
    assert r['est_batches'] == r['minmax_est_batches'] == r['sampled'] == 0
    if e['n']:
        assert (Fraction(r['min']), Fraction(r['max'])) == (e['min'], e['max'])
        scale = max(abs(e['min']), abs(e['max'])) or 1
        # plus half the smallest float64 subnormal: a mean between two subnormals is not representable ([0, 2^-1074])
        assert abs(Fraction(r['mean']) - e['mean']) <= Fraction(1, 10**12) * scale + Fraction(2.**-1074) / 2
        assert r['mean_error'] == 0


@settings(max_examples=25)
@given(st.integers(0, 2**31), st.sampled_from([0., 0.01, 0.3]), st.sampled_from([1., 1e30]), st.booleans())
def test_running_stats_sampled_within_bounds(seed, bad_frac, scale, fused):
    "Large batches: exact counts; mean and std within the stated bounds, whether from the raw sums or (NaN/Inf, overflow of torch's float32 sums) the sample."
    g = torch.Generator().manual_seed(seed)
    xs = [(torch.randn(40_000, generator=g) * scale + scale) for _ in range(5)]
    for x in xs[::2]: x[torch.rand(40_000, generator=g) < bad_frac] = math.nan
    rs = RunningStats(sample=4096)
    with fused_kernel(fused):
        for x in xs: rs.record(x)
    r = rs.read()
    allx = torch.cat(xs).double()
    fin = allx[allx.isfinite()]
    assert (r['count'], r['nonfinite']) == (fin.numel(), allx.numel() - fin.numel())
    assert abs(r['mean'] - fin.mean().item()) <= r['mean_error'] + 1e-12 * scale
    assert abs(r['std'] - fin.std().item()) <= r['std_error'] + 1e-12 * scale
    assert (r['est_batches'] > 0) == (bad_frac > 0 or (scale > 1e19 and not fused))
    if not bad_frac: assert (r['min'], r['max']) == (fin.min().item(), fin.max().item())


# ----- the CPU one-pass kernel against the torch ops and float64 numpy

@given(DTYPES.flatmap(lambda d: values(d, max_size=300)), st.booleans())
def test_fused_sums_match_torch_and_numpy(x, minmax):
    "`_raw_sums` on the CPU (numba, float32) and with the torch ops: the same count, NaN exactly where torch has NaN/Inf, sums within float32 rounding of numpy's float64 ones, min/max exact."
    x = x.float().contiguous()          # what `_as_float` hands the kernel (half types upcast; float64 inputs take the torch ops)
    with fused_kernel(True): got = K._raw_sums(x, minmax)
    with fused_kernel(False): ref = K._raw_sums(x, minmax).double()
    a = x.double().numpy()
    fin = np.isfinite(a)
    assert got[2].item() == ref[2].item() == fin.sum()
    if not fin.all():
        assert got[[0, 1, 3, 4] if minmax else [0, 1]].isnan().all()
        return
    with np.errstate(over='ignore'):
        s, q = a.sum(), (a * a).sum()   # float64: float32 values cannot overflow it
    assert abs(got[0].item() - s) <= 1e-12 * np.abs(a).sum() and abs(got[1].item() - q) <= 1e-12 * q
    if minmax: assert got[3:].tolist() == [a.min(), a.max()] == ref[3:].tolist()


@pytest.mark.skipif(not K._HAVE_NUMBA, reason='numba is not installed')
def test_fused_count_at_the_float32_extremes():
    "The CPU loop counts NaN/Inf only when its float64 sum of squares is not finite: the largest float32 values keep it finite, and one Inf, -Inf or NaN among them is counted exactly."
    big = np.finfo(np.float32).max
    x = torch.tensor([big, -big] * 5000 + [1e-45, -1e-45, 0.], dtype=torch.float32)
    with fused_kernel(True): r = K._raw_sums(x, minmax=True)
    assert r[2].item() == x.numel() and torch.isfinite(r).all()
    assert math.isclose(r[1].item(), 10000 * float(big) ** 2, rel_tol=1e-12) and abs(r[0].item()) <= 2e-45
    assert r[3:].tolist() == [-float(big), float(big)]
    for bad in (float('inf'), float('-inf'), float('nan')):
        y = x.clone(); y[7] = bad; y[9] = bad
        with fused_kernel(True): r = K._raw_sums(y, minmax=True)
        assert r[2].item() == x.numel() - 2 and r[[0, 1, 3, 4]].isnan().all()


def test_hooks_on_the_device_path_never_sync():
    "With the torch ops a GPU runs (`fused_kernel(False)`): ActivationStats and the run-wide collector read nothing from the device over real training batches."
    import torch.nn.functional as F
    from torch import nn
    from miniai.datasets import fashion_dls
    from miniai.learner import Learner, TrainCB, Callback, CancelFitException, baseline_cnn, set_seed
    from miniai.activations import ActivationStats
    from miniai.statistics import StatisticsConfig, ActivationStatisticsHook
    class Stop(Callback):
        order = 10
        def after_batch(self):
            if self.learn.iter == 20: raise CancelFitException()
    def run(fused):
        set_seed(0)
        model = baseline_cnn()
        hook = ActivationStatisticsHook(StatisticsConfig(collect_input=False))
        with hook.attach(model, filter=nn.Conv2d), fused_kernel(fused), count_syncs() as cs:
            Learner(model, fashion_dls(256), F.cross_entropy, lr=0.1, cbs=[TrainCB(), Stop(), ActivationStats(nn.Conv2d)]).fit(1, valid=False)
        return cs.n
    assert run(False) == run(True) == 3   # the DataLoader's sampler reads 3 host values per epoch; the hooks none
