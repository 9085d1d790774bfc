"""One layer is hooked once, under one name, whatever the list or its aliases; two layers never share a name; `layers` of a kind
`select_modules` cannot read is refused when the callback is made."""
import warnings, pytest, torch
from torch import nn
from miniai.hooks import select_modules, HooksCallback
from miniai.activations import ActivationStats
from miniai.statistics import StatisticsCollector

def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

def n_hooks(model): return sum(len(m._forward_hooks) for m in model.modules())

def test_a_module_listed_twice_is_hooked_once():
    m, astats = net(), None
    astats = ActivationStats(layers=[m[0], m[0]])
    with warnings.catch_warnings():
        warnings.simplefilter('error')            # no CalledTwiceWarning: the layer runs once per forward
        with astats.attach(m): m(torch.randn(3, 4)); m(torch.randn(3, 4))
    assert astats.names == ['0'] and astats.calls == {'0': 2} and len(astats.series()['0']) == 2

class Shared(nn.Module):
    "One Linear registered under two names (`b = a`), run once per forward."
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4); self.b = self.a
    def forward(self, x): return self.b(x).relu()

def test_a_module_under_two_names_is_one_layer_under_its_first_name():
    s = Shared()
    assert [n for n, _ in select_modules(s, 'b')] == ['a']
    assert [n for n, _ in select_modules(s, ['a', 'b', s.a])] == ['a']
    astats = ActivationStats(layers='b')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with astats.attach(s): s(torch.randn(2, 4))
    assert astats.names == ['a'] and len(astats.series()['a']) == 1 and n_hooks(s) == 0

def test_names_classes_and_modules_mix_in_one_list():
    m = net()
    assert [n for n, _ in select_modules(m, ['2', nn.ReLU])] == ['1', '2']
    assert [n for n, _ in select_modules(m, [m[2], 'Linear'])] == ['0', '2']

def test_two_layers_with_one_hook_name_are_refused_before_anything_is_hooked():
    m = net(); m[0]._hook_name = m[2]._hook_name = 'enc'
    for cb in (ActivationStats(), HooksCallback(lambda *a: None)):
        with pytest.raises(ValueError, match=r"layers '0' and '2' are both named 'enc'.*give each its own `_hook_name`"):
            with cb.attach(m): m(torch.randn(1, 4))
        assert n_hooks(m) == 0

@pytest.mark.parametrize('layers,what', [(3, 'int'), (2.5, 'float')])
def test_a_layers_argument_that_is_no_selection_is_refused_when_made(layers, what):
    with pytest.raises(TypeError, match=rf"ActivationStats: `layers` is a layer name.*got {what}"): ActivationStats(layers=layers)
    with pytest.raises(TypeError, match=rf"select_modules|layers: expected a layer name.*got {what}"): select_modules(net(), layers)

def test_an_item_of_no_kind_names_its_position():
    with pytest.raises(TypeError, match=r"layers: item 1 \(float\) is no layer name, pattern, class"): select_modules(net(), ['0', 3.5])

def test_layers_run_outside_the_attached_model_are_reported_as_such():
    "checkpoint_sequential calls the layers, never the model's own forward (which starts each recorded forward under `attach`): the warning says so."
    from torch.utils.checkpoint import checkpoint_sequential
    from miniai.hooks import NothingRecordedWarning
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).train()
    astats = ActivationStats()
    with pytest.warns(NothingRecordedWarning, match=r"the hooked layers ran \d+ times, but never inside a call of the attached model.*checkpoint_sequential"):
        with astats.attach(m): checkpoint_sequential(m, 2, torch.randn(3, 4, requires_grad=True), use_reentrant=False).sum().backward()
    with pytest.warns(NothingRecordedWarning, match="no training forward ran while the hooks were on"):
        with astats.attach(m): pass                    # nothing ran at all: the plain sentence

def test_a_compiled_submodule_s_layers_keep_the_names_of_the_eager_model():
    "m.body = torch.compile(body): its layers are 'body.0', as in the eager model, so that the two runs compare layer by layer."
    def model(compiled):
        torch.manual_seed(0)
        m = nn.Sequential(); m.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU()); m.head = nn.Linear(4, 2)
        if compiled: m.body = torch.compile(m.body, backend='eager')
        return m
    eager, comp = model(False), model(True)
    assert [n for n, _ in select_modules(comp, None)] == [n for n, _ in select_modules(eager, None)] == ['body.0', 'head']
    assert [n for n, _ in select_modules(comp, 'body.*')] == ['body.0', 'body.1']
    runs = []
    for m in (eager, comp):
        astats = ActivationStats()
        with astats.attach(m): m.train(); m(torch.ones(3, 4))
        runs.append(astats)
    assert runs[0].names == runs[1].names and all(len(r) == 1 for r in runs[1].series().values())
    assert torch.allclose(runs[0].series()['body.0'].means, runs[1].series()['body.0'].means)
