"""Statistics at the edges: bad inputs never crash, every file is strict JSON, and random data
mixing huge, tiny, subnormal, NaN and Inf values gives the same numbers batch by batch, in one batch, and
merged, equal to numpy's float64 references (exactly for counts, min/max, zeros and sketch buckets)."""
import json, math, types, warnings
import numpy as np, pytest, torch
from torch import nn
import torch.nn.functional as F
from hypothesis import given, settings, HealthCheck, strategies as st

from miniai.learner import Learner, TrainCB
from miniai.sketch import QuantileSketch, SKETCH_ALPHA
from miniai.findings import THRESHOLDS
from miniai.statistics import StatisticsConfig, StatisticsCollector, ActivationStatisticsHook
from miniai.monitoring import StatisticsCB, check_statistics


def _raise(c): raise ValueError(f'not strict JSON: {c}')
def strict_json(obj):
    "`obj` through strict JSON: raises on NaN/Infinity, as `json.loads(text, parse_constant=raise)` does."
    return json.loads(json.dumps(obj, allow_nan=False), parse_constant=_raise)

def check_file(path):
    with open(path) as f: return json.loads(f.read(), parse_constant=_raise)

FULL = dict(collect_percentiles=[0, 1, 50, 99, 100], collect_histogram=True, histogram_bins=10, collect_sparsity=True)


# ----- constant streams and other legal tensors: no crash, exact numbers, strict JSON

CONSTANTS = [(0., torch.float32), (1e-40, torch.float32), (100., torch.float32), (1e30, torch.float32),
             (-1e38, torch.float32), (1e300, torch.float64), (-5e-324, torch.float64), (6e4, torch.float16),
             (-3e38, torch.bfloat16)]

@pytest.mark.parametrize('value,dtype', CONSTANTS, ids=[f'{v:g}-{str(d)[6:]}' for v, d in CONSTANTS])
@pytest.mark.parametrize('max_samples', [None, 1000])
def test_constant_streams(value, dtype, max_samples, tmp_path):
    x = torch.full((8,), value, dtype=dtype)
    exact = float(x[0].double())                 # the value as stored in dtype
    c = StatisticsCollector(StatisticsConfig(max_samples=max_samples, **FULL))
    for _ in range(3): c.update_statistics('m', x, x)
    o = c.get_statistics('m').output_stats
    assert (o.count, o.nonfinite, o.min, o.max) == (24, 0, exact, exact)
    assert o.percentiles == {p: exact for p in FULL['collect_percentiles']}
    assert o.histogram['counts'] == [24] and o.histogram['edges'] == [exact, exact]   # one zero-width bin
    assert o.sparsity_ratio == (1. if exact == 0 else 0.)
    for fmt in ('json', 'quantization'): strict_json(c.export_statistics(fmt, path=tmp_path/f'{fmt}.json')); check_file(tmp_path/f'{fmt}.json')
    c.save(tmp_path/'c.json')
    check_file(tmp_path/'c.json')
    assert StatisticsCollector.load(tmp_path/'c.json').state_dict() == c.state_dict()


def test_constant_stream_in_a_fit_does_not_crash():
    "A constant output of a size in [64, 16384), with collect_histogram: StatisticsCB's check reads it (a zero-width histogram)."
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    with torch.no_grad(): model[0].weight.zero_(); model[0].bias.fill_(100.)
    data = [(torch.randn(5, 4), torch.randn(5, 3)) for _ in range(3)]
    cb = StatisticsCB(StatisticsConfig(collect_histogram=True, collect_input=False), layers=[model[0]])
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        Learner(model, types.SimpleNamespace(train=data, valid=data), F.mse_loss, lr=0., cbs=[TrainCB(), cb]).fit(1)
    o = cb.stats.get_statistics('0').output_stats
    assert (o.min, o.max, o.std, o.histogram['counts']) == (100., 100., 0., [45])


def test_single_empty_all_nan(tmp_path):
    c = StatisticsCollector(StatisticsConfig(**FULL))
    c.update_statistics('one', None, torch.tensor([3.]))
    c.update_statistics('empty', None, torch.empty(0, 4))
    c.update_statistics('nan', None, torch.full((5,), math.nan))
    exp = strict_json(c.export_statistics(path=tmp_path/'e.json'))
    one = exp['one']['output_stats']
    assert (one['count'], one['mean'], one['std'], one['std_reason']) == (1, 3., None, 'needs at least 2 finite values')
    assert exp['one']['input_stats'] is None and exp['one']['input_stats_reason'] == 'input holds no tensor (NoneType)'
    assert exp['empty']['output_stats'] is None and exp['empty']['output_stats_reason'] == 'empty tensor'
    nan = exp['nan']['output_stats']
    assert (nan['count'], nan['nonfinite'], nan['mean'], nan['mean_reason']) == (0, 5, None, 'no finite values')
    assert nan['histogram'] is None and nan['histogram_reason'] == 'no finite values'
    assert set(nan['percentiles'].values()) == {None} and nan['percentiles_reason'] == 'no finite values'
    q = strict_json(c.export_statistics('quantization', path=tmp_path/'q.json'))
    assert q['nan']['qparams'] is None and q['nan']['qparams_reason'] == 'no finite values'
    assert q['empty'] == dict(min=None, max=None, percentiles={}, qparams=None, reason='empty tensor')
    check_file(tmp_path/'e.json'); check_file(tmp_path/'q.json')


def test_overflowing_std_and_ranges_are_null_with_reason(tmp_path):
    "std of ±1e200 (squares overflow float64) and a quantization range beyond float32: null + reason, never Infinity."
    c = StatisticsCollector(StatisticsConfig(**FULL))
    c.update_statistics('big', None, torch.tensor([1e200, -1e200], dtype=torch.float64))
    c.update_statistics('f32max', None, torch.tensor([3e38, -3e38]))
    exp = strict_json(c.export_statistics(path=tmp_path/'e.json'))
    b = exp['big']['output_stats']
    assert b['std'] is None and b['std_reason'] == 'overflow'
    assert (b['min'], b['max'], b['mean']) == (-1e200, 1e200, 0.)
    q = strict_json(c.export_statistics('quantization', path=tmp_path/'q.json'))
    for name in ('big', 'f32max'):
        assert q[name]['qparams'] is None and 'does not fit float32' in q[name]['qparams_reason']
    check_file(tmp_path/'e.json'); check_file(tmp_path/'q.json')


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes(dtype):
    x = torch.tensor([1., -2., 0., 0.5], dtype=dtype)
    c = StatisticsCollector(StatisticsConfig(**FULL))
    c.update_statistics('m', None, x)
    o = c.get_statistics('m').output_stats
    assert (o.count, o.min, o.max, o.mean, o.sparsity_ratio, sum(o.histogram['counts'])) == (4, -2., 1., -0.125, 0.25, 4)


def test_unusable_outputs_are_skipped_in_a_fit():
    "Hooks on modules returning None, int, complex or empty tensors skip them with a reason; the fit completes."
    class Out(nn.Module):
        def __init__(self, f): super().__init__(); self.f = f
        def forward(self, x): return self.f(x)
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 3)
            self.none, self.ints = Out(lambda x: None), Out(lambda x: x.long())
            self.cplx, self.empty = Out(lambda x: x.to(torch.complex64)), Out(lambda x: x[:0])
        def forward(self, x):
            for m in (self.none, self.ints, self.cplx, self.empty): m(x)
            return self.lin(x)
    model = Model()
    data = [(torch.randn(5, 4), torch.randn(5, 3)) for _ in range(2)]
    cb = StatisticsCB(StatisticsConfig(collect_histogram=True), layers=[model.lin, model.none, model.ints, model.cplx, model.empty])
    Learner(model, types.SimpleNamespace(train=data, valid=data), F.mse_loss, lr=0.1, cbs=[TrainCB(), cb]).fit(1)
    sk = cb.stats.skipped
    assert sk['none.output'] == 'output holds no tensor (NoneType)'
    assert sk['ints.output'] == 'dtype torch.int64 is not floating point'
    assert sk['cplx.output'] == 'dtype torch.complex64 is not floating point'
    assert sk['empty.output'] == 'empty tensor'
    assert cb.stats.get_statistics('lin').output_stats.count == 2 * 5 * 3
    exp = strict_json(cb.stats.export_statistics())
    assert exp['cplx']['output_stats'] is None and exp['cplx']['output_stats_reason'] == sk['cplx.output']
    assert exp['cplx']['input_stats']['count'] == 10 * 4


# ----- bad arguments: clear errors naming the field, nothing collected lost

@pytest.mark.parametrize('field,value', [('max_memory_mb', -1.), ('max_memory_mb', math.nan), ('max_memory_mb', math.inf),
                                         ('max_samples', -5), ('histogram_bins', 0), ('histogram_bins', 2.5),
                                         ('every', 0), ('update_frequency', 0), ('collect_percentiles', [math.nan])])
def test_config_rejects_bad_numbers(field, value):
    with pytest.raises(ValueError, match=field): StatisticsConfig(**{field: value})


@pytest.mark.parametrize('kw', [dict(sparse=-0.1), dict(sparse=1.5), dict(vanishing_std=math.nan), dict(exploding_std=math.inf)])
def test_bad_threshold_fields_are_refused(kw):
    "A threshold given as a keyword is a field of `Thresholds`, checked when the check or the callback is built."
    name = list(kw)[0]
    with pytest.raises(ValueError, match=name): check_statistics({}, **kw)
    with pytest.raises(ValueError, match=name): StatisticsCB(**kw)


@pytest.mark.parametrize('kw', [dict(range_threshold=-1), dict(skew_factor=math.inf), dict(range_threshold=math.nan)])
def test_bad_optional_limits_are_refused(kw):
    with pytest.raises(ValueError, match=list(kw)[0]): check_statistics({}, **kw)


def test_unknown_threshold_names_and_bad_arguments_are_refused():
    for f in (lambda: check_statistics({}, sparsity_threshold=0.5), lambda: StatisticsCB(std_threshold=0.01)):
        with pytest.raises(TypeError, match='Thresholds has no'): f()
    with pytest.raises(TypeError, match='must be a Thresholds'): check_statistics({}, thresholds=dict(sparse=0.5))
    with pytest.raises(ValueError, match='check_every'): StatisticsCB(check_every=0)
    with pytest.raises(ValueError, match='every'): StatisticsCB(every=0)
    with pytest.raises(TypeError, match='config'): StatisticsCB(config=dict(collect_sparsity=True))


def test_update_frequency_is_another_name_for_every(tmp_path):
    "One field, `every`; the usual API's `update_frequency` sets and reads it; a state saved with both keys still loads."
    from dataclasses import asdict
    cfg = StatisticsConfig(update_frequency=3)
    assert cfg == StatisticsConfig(every=3) and (cfg.every, cfg.update_frequency) == (3, 3)
    assert 'update_frequency' not in asdict(cfg)
    with pytest.raises(TypeError, match='another name for `every`'): StatisticsConfig(every=3, update_frequency=3)
    c = StatisticsCollector(cfg)
    for _ in range(7): c.update_statistics('m', None, torch.randn(10))
    assert (c.get_statistics('m').calls, c.get_statistics('m').n_updates) == (7, 3)
    sd = c.state_dict()
    old = {**sd, 'config': {**sd['config'], 'update_frequency': 3}}        # as written when both were fields
    assert StatisticsCollector().load_state_dict(old).state_dict() == sd


def _dead_relu_fit(epochs=1, **kw):
    "A fit of 10 training batches whose ReLU outputs only zeros (sparse, and vanishing: std 0), with `StatisticsCB(**kw)` on the ReLU."
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    with torch.no_grad(): model[0].weight.zero_(); model[0].bias.fill_(-1.)
    data = [(torch.randn(5, 4), torch.randn(5, 3)) for _ in range(10)]
    cb = StatisticsCB(layers=[model[1]], **kw)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        Learner(model, types.SimpleNamespace(train=data, valid=data[:2]), F.mse_loss, lr=0., cbs=[TrainCB(), cb]).fit(epochs)
    return cb, w


def test_statistics_cb_records_every_nth_batch_and_checks_every_n():
    cb, w = _dead_relu_fit(every=3, check_every=4)
    st = cb.stats.get_statistics('1')
    assert (st.calls, st.n_updates, st.total_samples) == (4, 4, 20)                 # training batches 1, 4, 7, 10
    assert sorted({a['iter'] for a in cb.alerts}) == [0, 4, 8, 9]                   # after batches 1, 5 and 9 (counted as `every` counts), and the epoch
    assert {(a['layer'], a['issue']) for a in cb.alerts} == {('1', 'vanishing'), ('1', 'sparse')}
    assert [str(o.message) for o in w] == ['1 is vanishing: its std 0 is below 0.2', '1 is sparse: 100.0% of its values are exactly 0 (> 90%)']
    assert cb.alerts[0]['message'] == '1 is vanishing: its std 0 is below 0.2'


def test_statistics_cb_thresholds_and_per_epoch():
    cb, w = _dead_relu_fit(epochs=2, per_epoch=True, sparse=None, vanishing_std=None)
    assert cb.alerts == [] and w == [] and cb.thresholds == THRESHOLDS.but(sparse=None, vanishing_std=None)
    assert len(cb.history) == 2 and [h['1'].n_updates for h in cb.history] == [10, 10]
    cb, w = _dead_relu_fit(check_every=None)
    assert {a['iter'] for a in cb.alerts} == {9}                                     # only after the epoch


def test_check_statistics_judges_nan_and_inf_with_the_shared_findings():
    c = StatisticsCollector(StatisticsConfig(collect_sparsity=True))
    c.update_statistics('some', None, torch.tensor([1., math.nan, -1., math.inf, 2., 0.5]))
    c.update_statistics('none', None, torch.full((8,), math.nan))
    c.update_statistics('fine', None, torch.randn(1000, generator=torch.Generator().manual_seed(0)))
    found = check_statistics(c)
    assert [(f['layer'], f['issue'], f['value'], f['total']) for f in found] == [('some', 'nonfinite values', 2, 6), ('none', 'no finite values', 8, 8)]
    assert check_statistics(c.get_all_statistics()) == found


def test_merge_refuses_different_configs():
    a = StatisticsCollector(StatisticsConfig(collect_sparsity=True, histogram_bins=10))
    b = StatisticsCollector(StatisticsConfig(collect_sparsity=False, histogram_bins=20))
    x = torch.randn(100)
    a.update_statistics('m', x, x); b.update_statistics('m', x, x)
    before = a.state_dict()
    with pytest.raises(ValueError) as e: a.merge(b)
    assert 'collect_sparsity (True vs False)' in str(e.value) and 'histogram_bins (10 vs 20)' in str(e.value)
    assert 'max_samples' not in str(e.value)          # only the fields that differ
    assert a.state_dict() == before                    # nothing lost
    with pytest.raises(TypeError, match='StatisticsCollector'): a.merge({'m': 1})


def test_load_refuses_non_strict_json(tmp_path):
    c = StatisticsCollector()
    c.update_statistics('m', None, torch.randn(10))
    c.save(tmp_path/'c.json')
    text = (tmp_path/'c.json').read_text().replace('"call_count": 0', '"call_count": NaN')
    (tmp_path/'bad.json').write_text(text)
    with pytest.raises(ValueError, match='strict JSON'): StatisticsCollector.load(tmp_path/'bad.json')


# ----- property tests against numpy float64

SPECIAL = [0., -0., math.nan, math.inf, -math.inf, 1e-40, -1e-45, 1e-30, 1.5, -2.]

def values(max_abs, width):
    if width == 32:                                   # the largest float32 not above max_abs
        m = np.float32(min(max_abs, 3.4e38))
        max_abs = float(m if float(m) <= max_abs else np.nextafter(m, np.float32(0)))
    return st.one_of(st.floats(-max_abs, max_abs, width=width), st.sampled_from(SPECIAL))

def data(max_abs):
    "A float32 or float64 array mixing ordinary, tiny, subnormal, NaN and Inf values (|finite| <= max_abs), and cut points."
    def build(dtype_width):
        dtype = np.float32 if dtype_width == 32 else np.float64
        return st.tuples(st.just(dtype), st.lists(values(max_abs, dtype_width),
                                                  min_size=1, max_size=60),
                         st.lists(st.integers(0, 60), max_size=4))
    return st.sampled_from([32, 64]).flatmap(build)

def _collect(chunks, cfg):
    c = StatisticsCollector(cfg)
    for ch in chunks: c.update_statistics('m', None, ch)
    return c

def _streams(c):
    return {(s['name'], s['kind'], s['key']): s for s in c.state_dict()['streams']}

def check_against_numpy(arr, cuts, moments_too):
    x = torch.from_numpy(arr)
    cuts = sorted({min(c, len(arr)) for c in cuts} | {0, len(arr)})
    chunks = [x[a:b] for a, b in zip(cuts, cuts[1:]) if b > a]
    cfg = StatisticsConfig(max_samples=None, **FULL)
    one, split = _collect([x], cfg), _collect(chunks, cfg)
    merged = StatisticsCollector(cfg)
    for ch in chunks: merged.merge(_collect([ch], cfg))
    ref = arr.astype(np.float64)
    fin = ref[np.isfinite(ref)]
    sketches = [_streams(c)[('m', 'output', '0')]['sketch'] for c in (one, split, merged)]
    assert sketches[0] == sketches[1] == sketches[2]             # int64 bucket counts: exactly the same
    for c in (one, split, merged):
        o = c.get_statistics('m').output_stats
        assert (o.count, o.nonfinite) == (len(fin), len(ref) - len(fin))
        if len(fin): assert o.sparsity_ratio == (fin == 0).sum() / len(fin)      # exact zeros, counted in int64
        else: assert math.isnan(o.sparsity_ratio)
        strict_json(c.export_statistics()); strict_json(c.export_statistics('quantization'))
        if not len(fin):
            assert o.histogram is None and all(math.isnan(v) for v in o.percentiles.values())
            continue
        assert (o.min, o.max) == (fin.min(), fin.max())
        h = o.histogram
        assert sum(h['counts']) == len(fin) and h == one.get_statistics('m').output_stats.histogram
        # against numpy's histogram over the same edges: a value may change bin only if it lies within the
        # sketch's relative error of an edge, or beyond the sketch's range
        edges = np.array(h['edges'])
        ref_counts = np.histogram(fin, bins=edges)[0] if len(edges) > 2 else np.array([len(fin)])
        lo, hi = QuantileSketch().exact_range
        movable = (np.abs(fin) < lo) | (np.abs(fin) > hi)
        near = [((np.abs(fin - e) <= 1.01*SKETCH_ALPHA*np.abs(fin)) | movable).sum() for e in edges[1:-1]]
        assert np.all(np.abs(np.cumsum(h['counts'])[:-1] - np.cumsum(ref_counts)[:-1]) <= near)
        # percentiles: the exported bounds hold numpy's exact percentiles
        ref_pct = np.percentile(fin, FULL['collect_percentiles'])
        for p, r in zip(FULL['collect_percentiles'], ref_pct):
            blo, bhi = o.percentile_bounds[p]
            assert blo <= r <= bhi or (math.isinf(r) and blo in (fin.min(), fin.max())), (p, blo, r, bhi)
            assert blo <= o.percentiles[p] <= bhi
        if o.percentile_error == SKETCH_ALPHA:                   # the relative bound claimed holds
            for p, r in zip(FULL['collect_percentiles'], ref_pct):
                if np.sign(o.percentile_bounds[p][0]) == np.sign(o.percentile_bounds[p][1]):
                    assert abs(o.percentiles[p] - r) <= 1.01 * SKETCH_ALPHA * abs(r) + 1e-300
        if moments_too:
            scale = np.abs(fin).max() or 1.
            unit = fin / scale                                       # a reference that cannot overflow
            assert abs(o.mean / scale - unit.mean()) <= 1e-12
            if len(fin) > 1:
                # m2 (the sum of squared deviations) is kept in float64: where it passes float64's range the std reads
                # inf, and where it falls below the normal range (std < about 1e-154) it loses precision down to 0
                m2_unit = ((unit - unit.mean())**2).sum()
                m2_log2 = (math.log2(m2_unit) if m2_unit > 0 else -math.inf) + 2*math.log2(scale)
                ok = abs(o.std / scale - unit.std(ddof=1)) <= 1e-9
                if -1000 < m2_log2 < 1023.9: assert ok
                elif m2_log2 >= 1023.9: assert ok or o.std == math.inf
                else: assert ok or o.std < 1e-153
    # save / load: exact round trip
    sd = split.state_dict()
    back = StatisticsCollector(cfg).load_state_dict(strict_json(sd))
    assert back.state_dict() == sd
    assert back.export_statistics() == split.export_statistics()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data(max_abs=1e15))
def test_random_batches_match_numpy(d):
    "Values up to 1e15 in magnitude (and down to subnormals)."
    dtype, vals, cuts = d
    check_against_numpy(np.array(vals, dtype=dtype), cuts, moments_too=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data(max_abs=1.7e308))
def test_random_batches_match_numpy_huge_values(d):
    dtype, vals, cuts = d
    check_against_numpy(np.array(vals, dtype=dtype), cuts, moments_too=True)


@settings(max_examples=60, deadline=None)
@given(st.lists(values(1e15, 64), min_size=1, max_size=40))
def test_exact_percentiles_match_numpy(vals):
    "With max_samples covering the data, percentiles are numpy's, exactly, and say so (error 0, not estimated)."
    arr = np.array(vals)
    c = _collect([torch.from_numpy(arr)], StatisticsConfig(collect_percentiles=[0, 25, 50, 99.9, 100], max_samples=100))
    o = c.get_statistics('m').output_stats
    fin = arr[np.isfinite(arr)]
    d = strict_json(c.export_statistics())['m']['output_stats']
    assert d['percentiles_estimated'] is False and d['percentile_error'] == 0
    if len(fin): assert list(o.percentiles.values()) == np.percentile(fin, [0, 25, 50, 99.9, 100]).tolist()


ALL_REDUCE_WORKER = '''
import json, os, sys, torch
import torch.distributed as dist
from miniai.statistics import StatisticsConfig, StatisticsCollector
dist.init_process_group('gloo')
rank = dist.get_rank()
c = StatisticsCollector(StatisticsConfig(histogram_bins=10 + 10*rank))      # rank 1 differs
c.update_statistics('m', None, torch.arange(5.) + rank)
before = c.state_dict()
try: c.all_reduce(); err = None
except ValueError as e: err = str(e)
with open(os.path.join(sys.argv[1], f'rank{rank}.json'), 'w') as f: json.dump(dict(err=err, kept=c.state_dict() == before), f)
dist.destroy_process_group()
'''

def test_all_reduce_refuses_different_configs(tmp_path):
    "Every rank raises the same clear error (no rank left waiting in a collective) and keeps what it collected."
    from _torchrun import run_two_ranks
    script = tmp_path/'worker.py'
    script.write_text(ALL_REDUCE_WORKER)
    proc = run_two_ranks(script, tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in range(2):
        res = json.loads((tmp_path/f'rank{r}.json').read_text())
        assert 'histogram_bins (10 vs 20)' in res['err'] or 'histogram_bins (20 vs 10)' in res['err'], res
        assert res['kept']


# ----- structured inputs against numpy float64: everything but the percentiles and the histogram is exact, however
# the NaN fall, however large the batch (sampled for the sketch or not), with the compiled loops and with the torch ops

import miniai.kernel
from miniai.kernel import FIELDS

EXACT_FIELDS = {'count', 'nonfinite', 'mean', 'std', 'min', 'max', 'sparsity_ratio'}
STRUCT = dict(collect_percentiles=[1, 50, 99], collect_histogram=True, histogram_bins=20, collect_sparsity=True, max_samples=None)

@pytest.fixture(params=[True, False], ids=['fused', 'torch-ops'])
def fused(request):
    "Run the test with the compiled CPU loops, then with the torch ops other devices run."
    with miniai.kernel.use_kernel('loops' if request.param else 'torch'): yield request.param

def _ref(x):
    ref = x.double().numpy().ravel()
    return ref, ref[np.isfinite(ref)]

def check_exact(o, x, std_rtol=1e-12):
    "`o` (TensorStatistics of tensor `x`) against numpy float64: counts, NaN, min/max, zeros exactly; mean/std to `std_rtol`; errors 0, never estimated; sampled percentiles within their bounds."
    ref, fin = _ref(x)
    assert (o.count, o.nonfinite) == (len(fin), len(ref) - len(fin))
    assert (o.min, o.max) == (fin.min(), fin.max())
    scale = np.abs(fin).max()
    assert abs(o.mean - fin.mean()) <= 1e-12 * scale, (o.mean, fin.mean())
    ref_std = fin.std(ddof=1)
    assert abs(o.std - ref_std) <= std_rtol * ref_std + 1e-300, (o.std, ref_std)
    assert o.sparsity_ratio == (fin == 0).sum() / len(fin)
    assert o.errors == dict(mean=0., std=0., sparsity_ratio=0.)
    assert not EXACT_FIELDS & set(o.estimated) and set(o.estimated) <= {'percentiles', 'histogram'}
    assert 'estimated' not in o.reasons and 'min' not in o.reasons and 'max' not in o.reasons
    assert sum(o.histogram['counts']) == len(fin)
    assert (set(o.estimated) == {'percentiles', 'histogram'}) == (o.histogram['sampling_error'] > 0)
    for p, r in zip(STRUCT['collect_percentiles'], np.percentile(fin, STRUCT['collect_percentiles'])):
        lo, hi = o.percentile_bounds[p]
        assert lo <= r <= hi, (p, lo, r, hi)
    strict_json(o.to_dict())

def _stats(x, batches=1, **kw):
    "Output statistics of `x` recorded in `batches` batches (split along the first dimension)."
    c = StatisticsCollector(StatisticsConfig(**{**STRUCT, **kw}))
    for ch in x.chunk(batches): c.update_statistics('m', None, ch)
    return c.get_statistics('m').output_stats


def test_nan_column_of_an_output(fused):
    "A [5000, 4] output whose first column is NaN: the mean and std of the other 15000 values, the NaN counted exactly."
    class NanColumn(nn.Module):
        def forward(self, x):
            y = x.clone(); y[:, 0] = math.nan
            return y
    model = nn.Sequential(nn.Linear(4, 4), NanColumn())
    x = torch.randn(5000, 4, generator=torch.Generator().manual_seed(0))
    hook = ActivationStatisticsHook(StatisticsConfig(**STRUCT))
    with hook.attach(model, layers=[model[1]]), torch.no_grad(): out = model(x)
    st = hook.get_statistics('1')
    assert (st.output_stats.count, st.output_stats.nonfinite) == (15000, 5000)
    check_exact(st.output_stats, out)
    check_exact(st.input_stats, model[0](x).detach())
    assert st.output_stats.estimated == ['percentiles', 'histogram']        # 20,000 values: the sketch got a sample
    for batches in (3, 5000):                                               # split: the same exact numbers
        check_exact(_stats(out, batches), out)


@pytest.mark.parametrize('k', [2, 3, 8, 64, 4097])
def test_nan_every_kth_value(k, fused):
    x = torch.randn(60_000, generator=torch.Generator().manual_seed(k)) * 3 + 1
    x[::k] = math.nan
    for batches in (1, 7):
        o = _stats(x, batches)
        assert o.nonfinite == len(range(0, 60_000, k))
        check_exact(o, x)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(k=st.integers(2, 5000), offset=st.integers(0, 5000), n=st.integers(2, 40_000), width=st.sampled_from([32, 64]),
       loc=st.floats(-1e6, 1e6), scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**16))
def test_nan_every_kth_value_property(fused, k, offset, n, width, loc, scale, seed):
    "Any stride and offset of NaN, in any size of float32 or float64 batch: the same exact statistics."
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale + loc
    x = x.to(torch.float32 if width == 32 else torch.float64)
    x[offset % n::k] = math.nan
    if len(_ref(x)[1]) < 2: return
    o = _stats(x)
    ref, fin = _ref(x)
    assert (o.count, o.nonfinite, o.min, o.max) == (len(fin), len(ref) - len(fin), fin.min(), fin.max())
    assert abs(o.mean - fin.mean()) <= 1e-12 * np.abs(fin).max()
    assert abs(o.std - fin.std(ddof=1)) <= 1e-10 * fin.std(ddof=1)
    assert o.errors == dict(mean=0., std=0., sparsity_ratio=0.) and not EXACT_FIELDS & set(o.estimated)


def test_zero_head_and_tail_with_one_nan(fused):
    "A head of exact zeros, a tail of 5 ± 1, one NaN: mean, std and sparsity exact, whole or in batches."
    g = torch.Generator().manual_seed(5)
    x = torch.cat([torch.zeros(30_000), 5 + (torch.rand(20_000, generator=g) * 2 - 1)])
    x[31_234] = math.nan
    for batches in (1, 4, 50):
        o = _stats(x, batches)
        assert o.sparsity_ratio == 30_000 / 49_999 and o.nonfinite == 1
        check_exact(o, x)


@pytest.mark.parametrize('value', [12345.678, -3e38])
@pytest.mark.parametrize('n', [100, 50_000])
def test_constant_tensors(value, n, fused):
    "A constant, small or sampled, even at -3e38 (squares beyond float32): std exactly 0, mean exactly the value."
    x = torch.full((n,), value)
    c = float(x[0].double())
    for batches in (1, 3):
        o = _stats(x, batches)
        assert (o.count, o.mean, o.std, o.min, o.max, o.sparsity_ratio) == (n, c, 0., c, c, 0.)
        assert o.percentiles == {1: c, 50: c, 99: c} and o.histogram['counts'] == [n]
        assert o.errors == dict(mean=0., std=0., sparsity_ratio=0.)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.floats(width=32, allow_nan=False, allow_infinity=False) | st.sampled_from([-3e38, 12345.678, 1e-40]),
       n=st.sampled_from([1000, 20_000]))
def test_constant_tensors_property(fused, value, n):
    "Any finite float32 constant (subnormals included): mean, min and max exactly the value, std exactly 0."
    x = torch.full((n,), value)
    c = float(x[0].double())
    o = _stats(x)
    assert (o.count, o.mean, o.std, o.min, o.max) == (n, c, 0., c, c)


def test_large_mean_small_spread(fused):
    "1000 + 0.01 * randn in float32: the std (1e-5 of the mean) from float64 moments, not lost to cancellation."
    x = 1000 + 0.01 * torch.randn(200_000, generator=torch.Generator().manual_seed(6))
    for batches in (1, 9):
        o = _stats(x, batches)
        check_exact(o, x, std_rtol=1e-6)
        assert abs(o.std / x.double().numpy().std(ddof=1) - 1) <= 1e-9         # in fact far better than 1e-6


def test_ones_and_one_huge_value_at_the_end(fused):
    "Ones and a single 3e38 at the last index: the max is 3e38 and the std (about 3e38 / sqrt(n)) right."
    for n in (1000, 100_000):
        x = torch.ones(n); x[-1] = 3e38
        o = _stats(x)
        check_exact(o, x, std_rtol=1e-12)
        assert o.max == float(np.float32(3e38))


def test_state_dict_version_3_by_field_name():
    c = StatisticsCollector(StatisticsConfig(collect_sparsity=True))
    c.update_statistics('m', None, torch.randn(50_000))             # sampled: a sampling record
    sd = strict_json(c.state_dict())
    assert sd['version'] == 3
    s = sd['streams'][0]
    assert list(s['moments']) == list(FIELDS) and set(s['sampling']) == {'sampled', 'weight', 'weight_sq'}
    assert all(type(v) is float for v in s['sketch']['count'])
    back = StatisticsCollector().load_state_dict(sd)
    assert back.state_dict() == sd and back.export_statistics() == c.export_statistics()
    for v in (2, 4, None, '3'):
        with pytest.raises(ValueError, match=f'state version {v!r} is not supported'):
            StatisticsCollector().load_state_dict({**sd, 'version': v})
    bad = json.loads(json.dumps(sd)); del bad['streams'][0]['moments']['m2']
    with pytest.raises(ValueError, match='moments'): StatisticsCollector().load_state_dict(bad)


def test_merged_collectors_equal_one_over_sampled_batches(fused):
    "Two collectors on alternate sampled batches merge into one process's counts, zeros and ranges exactly, mean and std to 1e-12."
    g = torch.Generator().manual_seed(7)
    batches = [(torch.randn(40_000, generator=g) * (1 + i)).relu() for i in range(6)]
    batches[2][::5] = math.nan
    cfg = StatisticsConfig(**STRUCT)
    one, a, b = StatisticsCollector(cfg), StatisticsCollector(cfg), StatisticsCollector(cfg)
    for i, x in enumerate(batches):
        one.update_statistics('m', None, x); (a if i % 2 else b).update_statistics('m', None, x)
    o, m = one.get_statistics('m').output_stats, a.merge(b).get_statistics('m').output_stats
    assert (o.count, o.nonfinite, o.min, o.max, o.sparsity_ratio) == (m.count, m.nonfinite, m.min, m.max, m.sparsity_ratio)
    assert abs(o.mean - m.mean) <= 1e-12 * abs(o.mean) and abs(o.std - m.std) <= 1e-12 * o.std
    check_exact(m, torch.cat(batches))


def test_a_single_percentile_and_bad_files_get_one_line_errors(tmp_path):
    "collect_percentiles=95 (not a list) names the fix; a truncated file, another JSON file, a list: a ValueError naming the file, no raw JSONDecodeError or KeyError."
    with pytest.raises(TypeError, match=r"`collect_percentiles` is a list of percentiles in \[0, 100\], got 95: write \[95\]"):
        StatisticsConfig(collect_percentiles=95)
    good = tmp_path/'stats.json'
    StatisticsCollector(StatisticsConfig()).save(good)
    for name, text, why in (('trunc.json', good.read_text()[:20], 'not strict JSON'), ('other.json', '{"a": 1}', "no 'config'"),
                            ('list.json', '[1]', "no 'config'")):
        (tmp_path/name).write_text(text)
        with pytest.raises(ValueError, match=rf"StatisticsCollector.load: .*{name} is not a statistics file written by `save`.*{why}"):
            StatisticsCollector.load(tmp_path/name)
    assert isinstance(StatisticsCollector.load(good), StatisticsCollector)
