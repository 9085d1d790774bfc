"""Findings at their edges: thresholds that contradict each other or leave their range are refused by name, and `judge`
refuses a statistic it cannot mean (a percent given as a fraction, a negative std) while NaN and None stay 'not measured'."""
import math
import numpy as np, pytest, torch
from torch import nn
from miniai.findings import Thresholds, THRESHOLDS, judge, finding

@pytest.mark.parametrize('kw,field', [
    (dict(vanishing_std=20, exploding_std=10), 'vanishing_std'),    # a layer with std 15 would be both
    (dict(vanishing_std=10, exploding_std=10), 'vanishing_std'),
    (dict(vanishing_std=0), 'vanishing_std'), (dict(exploding_std=0), 'exploding_std'),
    (dict(exploding_std=-1), 'exploding_std'), (dict(vanishing_std=math.nan), 'vanishing_std'),
    (dict(exploding_std=math.inf), 'exploding_std'), (dict(dead=math.nan), 'dead'),
    (dict(dead=80), 'dead'), (dict(sparse=-0.1), 'sparse'), (dict(saturated=1.01), 'saturated')])
def test_inconsistent_or_out_of_range_thresholds_are_refused(kw, field):
    with pytest.raises(ValueError, match=f'`{field}`'): Thresholds(**kw)

def test_but_checks_the_result_too():
    with pytest.raises(ValueError, match='`vanishing_std`.*below `exploding_std`'): THRESHOLDS.but(vanishing_std=20)
    with pytest.raises(ValueError, match='`vanishing_std`.*below `exploding_std`'): THRESHOLDS.but(exploding_std=0.1)

def test_consistent_thresholds_and_switched_off_checks_are_kept():
    "The edges that make sense: fractions of exactly 0 and 1, one of the two std checks off, a vanishing limit above 10 with no exploding check."
    t = Thresholds(vanishing_std=50, exploding_std=None, dead=1, sparse=0, saturated=None)
    assert [f['issue'] for f in judge('x', std=20., dead=1., sparse=0.01)] == ['exploding', 'dead']
    assert [f['issue'] for f in judge('x', std=20., dead=1., sparse=0.01, thresholds=t)] == ['vanishing', 'sparse']
    assert Thresholds(vanishing_std=0.5, exploding_std=0.6).exploding_std == 0.6

@pytest.mark.parametrize('kw,field', [(dict(dead=85), 'dead'), (dict(sparse=1.5), 'sparse'), (dict(saturated=-0.01), 'saturated'),
                                      (dict(saturated=math.inf), 'saturated'), (dict(std=-0.5), 'std'), (dict(std=-math.inf), 'std')])
def test_judge_refuses_what_it_cannot_mean(kw, field):
    with pytest.raises(ValueError, match=f'judge: `{field}`'): judge('conv1', **kw)

@pytest.mark.parametrize('kw,field', [(dict(dead='0.5'), 'dead'), (dict(std=True), 'std'), (dict(sparse=[0.1]), 'sparse')])
def test_judge_refuses_what_is_not_a_number(kw, field):
    with pytest.raises(TypeError, match=f'judge: `{field}`'): judge('conv1', **kw)

def test_judge_refuses_thresholds_of_another_kind():
    with pytest.raises(TypeError, match='`thresholds`'): judge('conv1', std=0.1, thresholds=dict(vanishing_std=0.2))

def test_nan_and_none_are_not_measured():
    "NaN (a statistic over no finite values) and None (not collected) give no finding and no error; +Inf std is exploding."
    assert judge('a', std=math.nan, dead=math.nan, sparse=None, saturated=math.nan) == []
    assert judge('a', std=np.float32('nan'), dead=torch.tensor(math.nan)) == []
    assert [f['issue'] for f in judge('a', std=math.inf)] == ['exploding']

def test_numpy_and_torch_numbers_are_judged_like_floats():
    got = judge('a', std=np.float64(0.1), dead=np.float32(0.9), saturated=torch.tensor(0.2, dtype=torch.float64))
    assert [f['issue'] for f in got] == ['vanishing', 'dead', 'saturated']

def test_judge_on_a_real_dead_layer():
    "A ReLU after a layer with a large negative bias: its exact dead fraction is 1, a fraction, and it is judged dead."
    torch.manual_seed(0)
    lin = nn.Linear(10, 50); nn.init.constant_(lin.bias, -100.)
    out = torch.relu(lin(torch.randn(64, 10)))
    dead = (out.abs() < 0.25).double().mean().item()
    assert dead == 1.
    found = judge('relu', std=out.std().item(), dead=dead, sparse=(out == 0).double().mean().item())
    assert [f['issue'] for f in found] == ['vanishing', 'dead', 'sparse']
    assert found[1] == finding('relu', 'dead', 1., 0.8, 'dead')
    with pytest.raises(ValueError, match='`dead` is a fraction'): judge('relu', dead=dead * 100)

@pytest.mark.parametrize('kw,field', [(dict(sat_low=1., sat_high=-1.), 'sat_low'), (dict(sat_low=0., sat_high=0.), 'sat_low'),
                                      (dict(sat_high=math.nan), 'sat_high'), (dict(sat_low=True), 'sat_low'),
                                      (dict(narrow_range=-1.), 'narrow_range'), (dict(skewed=math.inf), 'skewed'),
                                      (dict(clipped=150), 'clipped'), (dict(clipped=-1), 'clipped')])
def test_the_run_wide_and_saturation_fields_are_checked(kw, field):
    "Every threshold lives in `Thresholds`: the saturation limits (values, sat_low < sat_high) and the run-wide checks' limits."
    with pytest.raises(ValueError, match=f'`{field}`'): Thresholds(**kw)

def test_old_keyword_names_set_the_threshold_fields():
    "check_statistics' `range_threshold`, `skew_factor` and `saturation=True` are the fields `narrow_range`, `skewed` and `clipped=99`."
    from miniai.statistics import TensorStatistics, ModuleStatistics
    from miniai.monitoring import check_statistics
    o = TensorStatistics(count=100, mean=3., std=0.5, min=2.9, max=3.05, percentiles={99: 3.05})
    stats = {'fc': ModuleStatistics('fc', output_stats=o)}
    new = check_statistics(stats, narrow_range=0.5, skewed=2., clipped=99, vanishing_std=None)
    assert [f['issue'] for f in new] == ['narrow range', 'skewed', 'clipped']
    assert check_statistics(stats, range_threshold=0.5, skew_factor=2., saturation=True, vanishing_std=None) == new
    assert check_statistics(stats, THRESHOLDS.but(narrow_range=0.5, skewed=2., clipped=99, vanishing_std=None)) == new
    from miniai.findings import format_finding
    assert format_finding(new[2]) == 'fc looks clipped: its p99 3.05 equals its max'
    assert check_statistics(stats, vanishing_std=None) == []                                  # all three off by default


# ---------------------------------------------------------------- the verdict, on evidence dicts
from miniai.findings import verdict, peer_key, format_finding
from miniai.activations import _bounds as bounds_of   # the bounds of a bounded activation, as the verdict reads them

def layer(name, std, kind='Linear', **more):
    return dict(layer=name, kind=kind, std=std, mean=0., var=std**2, first_std=more.pop('first_std', std), zeros=0., **more)

def test_peer_key_and_bounds():
    assert peer_key('transformer.h.11.attn.c_proj') == 'transformer.h.*.attn.c_proj' and peer_key('layer3.0.conv2') == 'layer*.*.conv*'
    from torch import nn
    assert bounds_of(nn.Tanh()) == (-1., 1.) and bounds_of(nn.ReLU6()) == (0., 6.) and bounds_of(nn.Hardtanh(-2, 3)) == (-2., 3.)
    assert bounds_of(nn.ReLU()) is None and bounds_of(nn.Linear(2, 2)) is None

def test_verdict_peers_by_role_and_downstream():
    "Output projections small by design are judged among themselves; a layer 30x its peers is named, what it feeds is downstream."
    ls = []
    for i in range(4):
        ls += [layer(f'h.{i}.fc', 0.17 * (30 if i == 2 else 1)), layer(f'h.{i}.proj', 0.03 * (20 if i == 2 else 1))]
    found, notes = verdict(ls)
    flagged = {n: [f['issue'] for f in fs] for n, fs in found.items() if fs and not fs[0].get('downstream')}
    assert flagged == {'h.2.fc': ['exploding']}
    assert [f['downstream'] for f in found['h.2.proj']] == ['h.2.fc']
    assert format_finding(found['h.2.fc'][0]) == "h.2.fc is exploding from its first batch: its std 5.1 is 30x its 2 peers' (0.17): check the init of this layer (the scale of its weights)"

def test_verdict_zero_init_growth_and_divergence():
    zero = layer('b.2', 0.5, first_std=0., params=True)             # zero at first (LoRA's B), grown to its peers' scale
    ls = [layer('b.0', 1.), layer('b.1', 1.), zero, layer('b.3', 1.)]
    assert not any(verdict(ls)[0].values())
    grown = [dict(layer(f'b.{i}', 500.), first_std=1., max_std=1e6) for i in range(4)]   # every layer 100x and more: the learning rate
    found, _ = verdict(grown)
    assert [f['issue'] for f in found['']] == ['exploding'] and 'lower the learning rate' in format_finding(found[''][0])
    assert all(f.get('downstream') == '' for n in ('b.0', 'b.1') for f in found[n])

def test_verdict_dead_below_zero_and_saturated():
    relu_in = dict(layer('c.1', 1.), mean=-50.)                       # 50 stds below 0: a ReLU after it passes nothing
    tanh = dict(layer('t', 0.97, kind='Tanh', bounds=(-1., 1.)), var=0.95)
    found, _ = verdict([layer('c.0', 1.), relu_in, layer('c.2', 1.), tanh])
    assert [f['issue'] for f in found['c.1']] == ['dead'] and format_finding(found['c.1'][0]).startswith('c.1 is dead behind a ReLU: its mean -50 is 50.0 stds below 0')
    assert [f['issue'] for f in found['t']] == ['saturated'] and 'downstream' not in found['t'][0]     # a dead layer does not saturate one after it
