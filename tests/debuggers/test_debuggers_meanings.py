"""One meaning per word in the debuggers: sparsity and saturation are fractions of the finite values (lesson 09e),
the saturation limits live in `Thresholds`, `max_items` counts batch items (`max_samples`, its earlier name, still works),
and a debugger hooks its layer with lesson 10's `Hook`: its own passes are seen only by what it watches."""
import copy, math, threading
import pytest, torch
from torch import nn
from miniai.core import paused_recording
from miniai.findings import THRESHOLDS, Thresholds
from miniai.hooks import Hook
from miniai.debuggers import ActivationStatsDebugger, FeatureMapDebugger, SequentialDebugger
import miniai.debuggers as dbg

class Const(nn.Module):
    def __init__(self, t): super().__init__(); self.t = t
    def forward(self, x): return self.t.clone()

def stats(t, **kw): return ActivationStatsDebugger('', **kw)({'inputs': None}, Const(t))['activation_stats']

def test_sparsity_and_saturation_are_fractions_of_the_finite_values():
    t = torch.tensor([0., 0., 2., -3., 0.5, math.nan, math.inf, -math.inf])   # 5 finite values: 2 zeros, 1 >= 1, 1 <= -1
    st = stats(t)
    assert st['nonfinite'] == 3
    assert st['sparsity'] == pytest.approx(2/5) and st['saturation_high'] == pytest.approx(1/5) and st['saturation_low'] == pytest.approx(1/5)
    none = stats(torch.full((4,), math.nan))
    assert math.isnan(none['sparsity']) and math.isnan(none['saturation_high'])   # no finite value: undefined, not 0

def test_finite_outputs_give_the_numbers_as_before():
    x = torch.randn(4, 8, 5, 5, generator=torch.Generator().manual_seed(0)) * 2
    x[:, :2] = 0
    st = stats(x)
    assert st['sparsity'] == (x == 0).double().mean().item()
    assert st['saturation_low'] == (x <= -1).float().mean().item() and st['saturation_high'] == (x >= 1).float().mean().item()

def test_saturation_limits_are_thresholds_fields():
    d = ActivationStatsDebugger('0')
    assert isinstance(d.thresholds, Thresholds) and (d.sat_low, d.sat_high) == (THRESHOLDS.sat_low, THRESHOLDS.sat_high)
    d = ActivationStatsDebugger('0', sat_low=-2, sat_high=0.5)
    assert (d.thresholds.sat_low, d.thresholds.sat_high) == (-2., 0.5) and d.thresholds.saturated == THRESHOLDS.saturated
    assert stats(torch.tensor([-3., -1.5, 0.6, 0.]), sat_low=-2, sat_high=0.5)['saturation_low'] == 0.25
    with pytest.raises(ValueError, match='sat_low must be below sat_high'): ActivationStatsDebugger('0', sat_low=1., sat_high=1.)

def test_max_items_counts_batch_items_and_keeps_its_earlier_name():
    model, x = nn.Sequential(nn.Linear(4, 3)), torch.randn(5, 4)
    new, old = FeatureMapDebugger('0', max_items=2), FeatureMapDebugger('0', max_samples=2)
    assert new.max_items == old.max_items == old.max_samples == 2
    assert new({'inputs': x}, model)['feature_map'].shape == old({'inputs': x}, model)['feature_map'].shape == (2, 3)
    with pytest.raises(TypeError, match='`max_samples` is another name for `max_items`'): FeatureMapDebugger('0', max_items=1, max_samples=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_sample'"): FeatureMapDebugger('0', max_sample=2)
    with pytest.raises(ValueError, match='`max_items` must be an integer >= 1'): FeatureMapDebugger('0', max_items=0)

def test_a_debugger_hooks_with_lesson_10s_hook_and_leaves_nothing_behind():
    model, x = nn.Sequential(nn.Linear(4, 3), nn.ReLU()), torch.randn(2, 4)
    fm = FeatureMapDebugger('0').attach(model)
    assert type(fm.hook) is Hook and fm.hook.name == '0'
    assert copy.deepcopy(model)(x).shape == (2, 3)
    fm.remove()
    sd = SequentialDebugger(100, [{'name': 'fm', 'debugger_config': {'class': 'FeatureMapDebugger', 'args': {'layer': '0'}}},
                                  {'name': 'cam', 'debugger_config': {'class': 'GradCAMDebugger', 'args': {'layer': '0'}}}])
    sd.collect({'inputs': x}, model)                                        # own passes: their watch hooks are removed after
    assert sum(len(m._forward_hooks) for m in model.modules()) == 0

def test_own_pass_shows_only_this_thread_what_it_watches():
    model = nn.Sequential(nn.Linear(4, 3))
    seen, lesson10 = [], []
    other = threading.Thread(target=lambda: model(torch.randn(1, 4)))
    with Hook(model[0], lambda h, m, i, o: lesson10.append(o.shape[0])):
        with dbg.own_pass((model[0], lambda m, i, o: seen.append(o.shape[0]))):
            model(torch.randn(2, 4))
            other.start(); other.join()                                     # another thread's forward: not this pass
        with paused_recording(): model(torch.randn(3, 4))                   # another tool's pause: nothing watched
    assert seen == [2] and lesson10 == [1]
