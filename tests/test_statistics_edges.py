"""Statistics at the edges (issue #11): bad inputs never crash, every file is strict JSON, and random data
mixing huge, tiny, subnormal, NaN and Inf values gives the same numbers batch by batch, in one batch, and
merged, equal to numpy's float64 references (exactly for counts, min/max, zeros and sketch buckets)."""
import json, math, types, warnings
import numpy as np, pytest, torch
from torch import nn
import torch.nn.functional as F
from hypothesis import given, settings, HealthCheck, strategies as st

from miniai.learner import Learner, TrainCB
from miniai.statistics import (StatisticsConfig, StatisticsCollector, ActivationStatisticsHook, StatisticsCB,
                               check_statistics, QuantileSketch, SKETCH_ALPHA)


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
    "The bug of issue #11: a constant output in [64, 16384) with collect_histogram crashed StatisticsCB's check."
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    with torch.no_grad(): model[0].weight.zero_(); model[0].bias.fill_(100.)
    data = [(torch.randn(5, 4), torch.randn(5, 3)) for _ in range(3)]
    cb = StatisticsCB(StatisticsConfig(collect_histogram=True, collect_input=False), mods=[model[0]])
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
    cb = StatisticsCB(StatisticsConfig(collect_histogram=True), mods=[model.lin, model.none, model.ints, model.cplx, model.empty])
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
                                         ('update_frequency', 0), ('collect_percentiles', [math.nan])])
def test_config_rejects_bad_numbers(field, value):
    with pytest.raises(ValueError, match=field): StatisticsConfig(**{field: value})


@pytest.mark.parametrize('kw', [dict(sparsity_threshold=-0.1), dict(sparsity_threshold=1.5), dict(std_threshold=math.nan),
                                dict(range_threshold=-1), dict(skew_factor=math.inf)])
def test_thresholds_rejected(kw):
    name = list(kw)[0]
    with pytest.raises(ValueError, match=name): check_statistics({}, **kw)
    if name in ('sparsity_threshold', 'std_threshold'):
        with pytest.raises(ValueError, match=name): StatisticsCB(**kw)
    with pytest.raises(ValueError, match='check_every'): StatisticsCB(check_every=0)


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
