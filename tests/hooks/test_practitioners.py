"""Practitioners' models: layers picked by glob pattern and by predicates that take the name; hooked layers
that recorded nothing reported when the recording ends (`NothingRecordedWarning`); a model compiled in place refused at
attach / before fit instead of recording zeros; `format_diagnosis` aligned for long layer names; each forward recorded once
under gradient checkpointing (gradients of checkpointed layers in both `use_reentrant` modes); a module called several times
per forward reported (`CalledTwiceWarning`); plots readable at 24-50 layers and unchanged at 10 or fewer.
Real small models trained for a few steps; nothing is downloaded and nothing is compiled (the compiled model is refused
before its first call, and `torch.compile` compiles lazily; tests/hooks/test_compile.py compiles)."""
import re, warnings
from collections import OrderedDict

import pytest, torch
from torch import nn
import torch.nn.functional as F
import fastcore.all as fc
from torch.utils.data import DataLoader, TensorDataset

from miniai.datasets import DataLoaders
from miniai.hooks import HooksCallback, LayerNotFoundError, NothingRecordedWarning, CalledTwiceWarning, select_modules, recomputing
from miniai.statistics import ActivationStatisticsHook
from torch.utils.checkpoint import checkpoint
from miniai.learner import Learner, TrainCB
from miniai.activations import ActivationStats, format_diagnosis

pytestmark = pytest.mark.usefixtures('one_thread')   # see conftest.py


class Block(nn.Module):
    "A residual block shaped like torchvision's: conv1, conv2 and a `downsample` branch."
    def __init__(self, ni, nf):
        super().__init__()
        self.conv1, self.conv2 = nn.Linear(ni, nf), nn.Linear(nf, nf)
        self.downsample = nn.Sequential(nn.Linear(ni, nf))
    def forward(self, x): return F.relu(self.conv2(F.relu(self.conv1(x)))) + self.downsample(x)

def resnetish(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(stem=nn.Linear(6, 8), layer1=nn.Sequential(Block(8, 8)),
                                     layer2=nn.Sequential(Block(8, 12), Block(12, 12)), head=nn.Linear(12, 3)))

def dls(n_train=3, bs=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n_train * bs, 6, generator=g), torch.randint(0, 3, (n_train * bs,), generator=g)
    return DataLoaders(DataLoader(TensorDataset(x, y), batch_size=bs), DataLoader(TensorDataset(x[:bs], y[:bs]), batch_size=bs))

def hooks_left(model): return [n for n, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks]

def names(model, layers): return [n for n, _ in select_modules(model, layers)]

def silent_warnings(w): return [str(o.message) for o in w if issubclass(o.category, NothingRecordedWarning)]


# 1. layers by pattern, predicates that take the name

def test_glob_patterns_pick_qualified_names_in_model_order():
    m = resnetish()
    assert names(m, 'layer2.*') == ['layer2.0', 'layer2.0.conv1', 'layer2.0.conv2', 'layer2.0.downsample', 'layer2.0.downsample.0',
                                    'layer2.1', 'layer2.1.conv1', 'layer2.1.conv2', 'layer2.1.downsample', 'layer2.1.downsample.0']
    assert names(m, '*.conv?') == ['layer1.0.conv1', 'layer1.0.conv2', 'layer2.0.conv1', 'layer2.0.conv2', 'layer2.1.conv1', 'layer2.1.conv2']
    assert names(m, 'layer[12].0.conv1') == ['layer1.0.conv1', 'layer2.0.conv1']
    # patterns, exact names and class names mix; each module once, in the model's order
    assert names(m, ['head', '*.downsample.0', 'layer1.*.conv2', 'Block']) == [
        'layer1.0', 'layer1.0.conv2', 'layer1.0.downsample.0', 'layer2.0', 'layer2.0.downsample.0', 'layer2.1', 'layer2.1.downsample.0', 'head']
    assert '' not in names(m, '*') and len(names(m, '*')) == len(list(m.modules())) - 1   # a pattern never picks the root

def test_a_pattern_that_matches_nothing_names_layers_and_the_closest():
    m = resnetish()
    with pytest.raises(LayerNotFoundError, match=r"^layers: the pattern 'Layer2\.\*' matches no layer name") as e:
        select_modules(m, 'Layer2.*')   # fnmatchcase: case matters, as in the names
    assert 'closest layer names' in str(e.value)
    with pytest.raises(LayerNotFoundError, match=r"target_layer: the pattern 'layer3\.\*'"):
        select_modules(m, ['stem', 'layer3.*'], arg='target_layer')
    with pytest.raises(LayerNotFoundError, match="neither a layer name nor a class name"): select_modules(m, 'layer3')   # no glob: as before

def test_predicates_take_the_module_or_the_name_and_module():
    m = resnetish()
    assert names(m, lambda n, mod: n.startswith('layer2') and isinstance(mod, nn.Linear)) == [
        'layer2.0.conv1', 'layer2.0.conv2', 'layer2.0.downsample.0', 'layer2.1.conv1', 'layer2.1.conv2', 'layer2.1.downsample.0']
    assert names(m, lambda mod: isinstance(mod, Block)) == ['layer1.0', 'layer2.0', 'layer2.1']
    assert names(m, fc.risinstance(Block)) == ['layer1.0', 'layer2.0', 'layer2.1']
    def wide(mod, at_least=12): return isinstance(mod, nn.Linear) and mod.out_features >= at_least   # a default: the module alone
    assert names(m, wide) == ['layer2.0.conv1', 'layer2.0.conv2', 'layer2.0.downsample.0', 'layer2.1.conv1', 'layer2.1.conv2', 'layer2.1.downsample.0']
    seen = []
    def spy(name, mod): seen.append(name); return False
    assert names(m, spy) == [] and seen == [n for n, _ in m.named_modules()]

def test_activation_stats_records_the_layers_a_pattern_picks():
    m = resnetish()
    cb = ActivationStats('layer2.*.conv?')
    Learner(m, dls(), F.cross_entropy, lr=0.01, cbs=[TrainCB(), cb]).fit(1, valid=False)
    assert cb.names == ['layer2.0.conv1', 'layer2.0.conv2', 'layer2.1.conv1', 'layer2.1.conv2']
    assert [len(h.stats[0]) for h in cb] == [3] * 4


# 2. hooked layers that recorded nothing, reported when the recording ends

class Functional(nn.Module):
    "`skip` is a layer with parameters that the forward uses through `F.linear`, never as a module."
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.skip, self.head = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
    def forward(self, x): return self.head(F.relu(self.lin(x)) + F.linear(x, self.skip.weight, self.skip.bias))

def test_fit_reports_the_layer_that_never_ran_as_a_module_in_one_warning():
    m = Functional()
    cb = ActivationStats()
    with pytest.warns(NothingRecordedWarning) as w:
        Learner(m, dls(), F.cross_entropy, lr=0.01, cbs=[TrainCB(), cb]).fit(1)
    [msg] = silent_warnings(w)
    assert msg.startswith('ActivationStats: 1 of 3 hooked layers recorded nothing: skip; ') and 'functional form' in msg and 'torch.compile' in msg
    assert [len(h.stats[0]) for h in cb if h.name != 'skip'] == [3, 3] and not hooks_left(m)

class WithAux(nn.Module):
    "A model whose `aux` head the user's loop calls itself, outside the model's forward."
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.aux = nn.Linear(6, 4), nn.Linear(4, 2)
    def forward(self, x): return self.body(x)

def test_every_layer_recorded_no_warning_and_a_submodule_called_outside_a_forward_is_reported():
    m = resnetish()
    cb = ActivationStats()
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with cb.attach(m): F.cross_entropy(m(torch.randn(4, 6)), torch.tensor([0, 1, 2, 0])).backward()
    assert all(n == 1 for n in cb.calls.values())
    m = WithAux()
    cb = ActivationStats()
    with pytest.warns(NothingRecordedWarning, match=r'1 of 2 hooked layers recorded nothing: aux; ') as w:
        with cb.attach(m): m.aux(m(torch.randn(4, 6)))   # `aux` called directly, after the model's forward: not recorded
    assert len(silent_warnings(w)) == 1 and list(cb.calls.values()) == [1, 0] and len(cb.hooks[0].stats[0]) == 1

def test_no_recorded_forward_at_all_is_one_warning_that_nothing_was_recorded():
    m = resnetish()
    cb = ActivationStats()
    with pytest.warns(NothingRecordedWarning) as w:
        with cb.attach(m), torch.no_grad(): m.eval()(torch.randn(4, 6))   # evaluation only, and on_valid is off
    assert silent_warnings(w) == ['ActivationStats: nothing was recorded: no training forward ran while the hooks were on']
    m.train()
    cb = HooksCallback(lambda *a: None, on_train=False, on_valid=True)
    with pytest.warns(NothingRecordedWarning) as w: Learner(m, dls(), F.cross_entropy, lr=0.01, cbs=[TrainCB(), cb]).fit(0)
    assert silent_warnings(w) == ['HooksCallback: nothing was recorded: no evaluation-mode (on_valid) forward ran while the hooks were on']

def test_the_report_comes_once_at_the_outermost_end_also_after_an_error():
    m = Functional()
    cb = ActivationStats()
    with pytest.warns(NothingRecordedWarning) as w:
        with cb.attach(m):
            with cb.attach(m): m(torch.randn(4, 6))                    # a nested block joins: no report at its exit
            assert silent_warnings(w) == []
            Learner(m, dls(), F.cross_entropy, lr=0.01, cbs=[TrainCB(), cb]).fit(1, valid=False)   # a fit inside joins too
            assert silent_warnings(w) == []
    assert len(silent_warnings(w)) == 1 and 'skip' in silent_warnings(w)[0] and list(cb.calls.values()) == [4, 0, 4]
    with pytest.warns(NothingRecordedWarning, match='recorded nothing: skip') as w, pytest.raises(RuntimeError, match='boom'):
        with cb.attach(m): m(torch.randn(4, 6)); raise RuntimeError('boom')
    assert not hooks_left(m)

def test_a_warnings_filter_error_raises_after_the_hooks_are_removed():
    m = Functional()
    cb = ActivationStats()
    with warnings.catch_warnings():
        warnings.simplefilter('error', NothingRecordedWarning)
        with pytest.raises(NothingRecordedWarning):
            with cb.attach(m): m(torch.randn(4, 6))
    assert not hooks_left(m) and [len(h.stats[0]) for h in cb if h.name != 'skip'] == [1, 1]   # what was recorded is kept


# 3. a compiled model: what its compiled code cannot record is refused when attaching, never silent zeros (nothing is compiled:
# the error comes before the first call); a torch.compile'd model records (tests/hooks/test_compile.py)

@pytest.mark.skipif(not hasattr(torch, 'compile'), reason='this torch has no torch.compile')
def test_attach_and_fit_refuse_a_compiled_model_and_say_what_to_do():
    m = resnetish()
    m.compile()                                                                     # nn.Module.compile: compiled in place
    for cb in (ActivationStats(), HooksCallback(lambda *a: None)):
        with pytest.raises(ValueError, match=r"the model is compiled in place.*compile with `torch.compile\(model\)` instead.*or attach \(or fit\) before"):
            with cb.attach(m): pass
        assert not hooks_left(m) and not cb._sessions
    with pytest.raises(ValueError, match="compiled in place"):
        Learner(m, dls(), F.cross_entropy, lr=0.01, cbs=[TrainCB(), ActivationStats()]).fit(1)
    assert not hooks_left(m)
    outer = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 3))
    outer[1].compile()                                                              # a part compiled in place, named
    with pytest.raises(ValueError, match=r"the model's layer '1' is compiled in place"): ActivationStats().attach(outer).__enter__()
    cm = torch.compile(resnetish())                                                 # gradients: hooks compiled code never calls
    with pytest.raises(ValueError, match=r"`output_grads=True` .* torch.compile does not call"): ActivationStats(output_grads=True).attach(cm).__enter__()
    assert not hooks_left(cm)


# format_diagnosis: the layer column as wide as the longest name

def test_format_diagnosis_keeps_numbers_aligned_with_long_names():
    m = resnetish()
    cb = ActivationStats()
    Learner(m, dls(), F.cross_entropy, lr=0.01, cbs=[TrainCB(), cb]).fit(1, valid=False)
    rows = cb.diagnose()
    text = format_diagnosis(rows)
    lines = text.splitlines()
    assert 'layer2.0.downsample.0' in text and len(lines) == len(rows) + 1
    width = max(len(r['layer']) for r in rows) + 1
    for line, r in zip(lines[1:], rows):
        assert line[:width].rstrip() == r['layer'] and line[width - 1] == ' '
        assert line[width:width + 10].strip() == f"{r['mean']:.3f}" and line[width + 10:width + 20].strip() == f"{r['std']:.3f}"
    assert lines[0][width:width + 10].strip() == 'mean' and lines[0][width + 10:width + 20].strip() == 'std'
    short = format_diagnosis([dict(r, layer='0') for r in rows[:2]]).splitlines()
    assert short[1].index(f"{rows[0]['mean']:.3f}") + len(f"{rows[0]['mean']:.3f}") == 14 + 10   # at least 14, as before



# 4. gradient checkpointing: each training forward recorded once, gradients recorded in both modes

class Ckpt(nn.Module):
    "Three layers, the middle block checkpointed (`reentrant` None: not checkpointed, the reference)."
    def __init__(self, reentrant=None):
        super().__init__()
        torch.manual_seed(0)
        self.reentrant, self.a, self.mid, self.c = reentrant, nn.Linear(6, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(8, 3)
    def forward(self, x):
        x = F.relu(self.a(x))
        x = self.mid(x) if self.reentrant is None else checkpoint(self.mid, x, use_reentrant=self.reentrant)
        return self.c(x)

def recorded(cb):
    "Per layer: (stats means, stds, gradient stds) as tensors; None where no gradient was recorded."
    return {h.name: (torch.as_tensor(h.stats[0]), torch.as_tensor(h.stats[1]),
                     h.recorders['output_grad'].stds if 'output_grad' in h.recorders else None) for h in cb}

@pytest.mark.parametrize('reentrant', [False, True])
def test_checkpointed_forwards_recorded_once_with_gradients_in_both_modes(reentrant):
    runs = {}
    for mode in (None, reentrant):
        m, cb = Ckpt(mode), ActivationStats(output_grads=True)
        with warnings.catch_warnings():
            warnings.simplefilter('error', CalledTwiceWarning)     # a recomputation is no second call
            Learner(m, dls(), F.cross_entropy, lr=0.01, cbs=[TrainCB(), cb]).fit(1, valid=False)
        assert cb.names == ['a', 'mid.0', 'c']
        assert [len(h.stats[0]) for h in cb] == [3] * 3 and [len(h.recorders['output_grad']) for h in cb] == [3] * 3, mode
        assert list(cb.calls.values()) == [3] * 3 and list(cb._grads_owed.values()) == [0] * 3
        runs[mode] = recorded(cb)
    for name, (means, stds, gstds) in runs[None].items():    # the same numbers as without checkpointing
        m2, s2, g2 = runs[reentrant][name]
        torch.testing.assert_close(m2, means); torch.testing.assert_close(s2, stds); torch.testing.assert_close(g2, gstds)

@pytest.mark.parametrize('reentrant', [False, True])
def test_checkpointing_under_attach_counts_once_for_stats_and_the_collector(reentrant):
    m, cb, col = Ckpt(reentrant), ActivationStats(output_grads=True), ActivationStatisticsHook()
    with cb.attach(m), col.attach(m):
        for _ in range(3): m(torch.randn(4, 6)).sum().backward()
    assert [(len(h.stats[0]), len(h.recorders['output_grad'])) for h in cb] == [(3, 3)] * 3 and cb._n_recorded == 3
    assert col.call_count == 9 and {n: d['total_samples'] for n, d in col._modules.items()} == {'a': 12, 'mid.0': 12, 'c': 12}
    # the whole model checkpointed (its own forward pre-hook runs again in backward), with the middle block nested inside
    m, cb = Ckpt(reentrant), ActivationStats(output_grads=True)
    with cb.attach(m), warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='None of the inputs have requires_grad')   # torch's, for the nested reentrant one
        for _ in range(3): checkpoint(m, torch.randn(4, 6, requires_grad=True), use_reentrant=reentrant).sum().backward()
    assert [(len(h.stats[0]), len(h.recorders['output_grad'])) for h in cb] == [(3, 3)] * 3 and (cb._n_train, cb._n_recorded) == (3, 3)

def test_recomputing_is_true_only_in_a_checkpoints_recomputation():
    seen = []
    block = nn.Sequential(nn.Linear(3, 3), nn.Tanh())      # tanh saves its output: the backward recomputes the block
    block[0].register_forward_hook(lambda *a: seen.append(recomputing()))
    for reentrant in (False, True):
        checkpoint(block, torch.randn(2, 3, requires_grad=True), use_reentrant=reentrant).sum().backward()
    block(torch.randn(2, 3)).sum().backward()
    assert seen == [False, True, False, True, False] and not recomputing()


# 5. a module called several times per forward: reported, its series one record per call

class TwiceRelu(nn.Module):
    "One `nn.ReLU` applied twice (as torchvision's ResNet blocks share `relu`), once when `once`; `lin` once."
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.relu, self.head = nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 3)
    def forward(self, x, once=False):
        x = self.relu(self.lin(x))
        return self.head(x if once else self.relu(x - 0.1))

def twice_warnings(w): return [str(o.message) for o in w if issubclass(o.category, CalledTwiceWarning)]

def test_a_module_called_twice_per_forward_is_reported_once_at_the_end():
    m = TwiceRelu()
    cb = ActivationStats(['ReLU', 'lin'])
    with pytest.warns(CalledTwiceWarning) as w:
        Learner(m, dls(), F.cross_entropy, lr=0.01, cbs=[TrainCB(), cb]).fit(1, valid=False)
    [msg] = twice_warnings(w)
    assert msg.startswith('ActivationStats: 1 of 2 hooked layers ran more than once in one recorded forward: relu (2 calls); ')
    assert 'one record per call' in msg and not silent_warnings(w) and not hooks_left(m)
    assert [(h.name, len(h.stats[0]), cb.calls[h.name]) for h in cb] == [('lin', 3, 3), ('relu', 6, 6)]   # two records per batch
    cb = HooksCallback(lambda *a: None, nn.ReLU)
    with pytest.warns(CalledTwiceWarning, match=r"^HooksCallback: 1 of 1 hooked layers .*: relu \(1 to 2 calls\); ") as w:
        with cb.attach(m):
            m(torch.randn(4, 6)); m(torch.randn(4, 6), once=True)
            m.eval()(torch.randn(4, 6)); m.train()                          # not recorded (on_valid is off): not counted
    assert len(twice_warnings(w)) == 1 and cb.calls[cb.hooks[0].name] == 3
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with cb.attach(m): m(torch.randn(4, 6), once=True); m(torch.randn(4, 6), once=True)   # once per forward: no warning


# 6. plots readable with 24 layers, drawn as before with 10 or fewer

def deep(n):
    "An MLP of `n` Linear layers with long, similar names ('stage3.residual_body.layer2.0'...)."
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict((f'stage{i}', nn.Sequential(OrderedDict(residual_body=nn.Sequential(OrderedDict(
        layer2=nn.Sequential(nn.Linear(6, 6), nn.Tanh())))))) for i in range(n)))

def stats_of(n, grads=False):
    m, cb = deep(n), ActivationStats(output_grads=grads)
    with cb.attach(m):
        for _ in range(3): m(torch.randn(4, 6)).sum().backward()
    return cb

def test_plots_with_ten_layers_or_fewer_keep_the_lessons_layout():
    import matplotlib.pyplot as plt
    for n, grid in ((5, 6), (10, 12)):       # get_grid's rows x columns at (11, 5), the values before the many-layer layout
        cb = stats_of(n, grads=True)
        for meth in ('color_dim', 'dead_chart'):
            getattr(cb, meth)()
            assert tuple(cb.fig.get_size_inches()) == (11, 5) and len(cb.fig.axes) == grid, (n, meth)
            assert [ax.get_title() for ax in cb.fig.axes[:n]] == [f'{name} Linear 6→6' for name in cb.names] and cb.fig.axes[0].get_xlabel() == 'batch'
            plt.close(cb.fig)
        for grads, size, naxes in ((True, (10, 8), 4), (False, (10, 4), 2)):
            cb.plot_stats(grads=grads)
            assert tuple(cb.fig.get_size_inches()) == size and len(cb.fig.axes) == naxes and not any(ax.get_legend() for ax in cb.fig.axes)
            [leg] = cb.fig.legends       # beside the panels, off the lines
            assert [t.get_text() for t in leg.get_texts()] == [f'{name} Linear 6→6' for name in cb.names]
            plt.close(cb.fig)

def test_plots_stay_readable_with_24_layers():
    import matplotlib.pyplot as plt
    cb = stats_of(24)
    names = cb.names
    assert len(names) == 24 and names[3] == 'stage3.residual_body.layer2.0'
    for meth in ('color_dim', 'dead_chart'):
        getattr(cb, meth)()
        fig = cb.fig
        w, h = fig.get_size_inches()
        assert w > 11 and h > 5 and w <= 20 and h <= 24, (meth, w, h)
        panels = [ax for ax in fig.axes if ax.get_title()]
        titles = [ax.get_title() for ax in panels]
        assert len(titles) == 24 and len(set(titles)) == 24, titles                     # no two panels titled alike
        assert all(t == n or (t.startswith('…') and n.endswith(t[1:]) and len(t) < len(n)) for t, n in zip(titles, names))
        assert titles[0] == '…e0.residual_body.layer2.0' and len(titles[3]) <= 26
        if meth == 'color_dim':                                                          # one colour scale for all, shown once
            [bar] = [ax for ax in fig.axes if ax.get_ylabel() == 'log1p(count)']
            assert len({ax.images[0].get_clim() for ax in panels}) == 1 and bar.get_ylim() == panels[0].images[0].get_clim()
        plt.close(fig)
    cb.plot_stats()
    fig = cb.fig
    [leg] = fig.legends
    assert fig.get_size_inches()[0] > 10 and not any(ax.get_legend() for ax in fig.axes)
    fig.canvas.draw()
    box, right = leg.get_window_extent(), max(ax.get_window_extent().x1 for ax in fig.axes)
    assert box.x0 >= right and box.x1 <= fig.bbox.x1 and box.y0 >= fig.bbox.y0, (box, right)   # right of the panels, inside the figure
    lines = fig.axes[0].get_lines()
    assert len(lines) == 24 and len({(l.get_color(), l.get_linestyle()) for l in lines}) == 24   # 24 distinct colours and styles
    assert len(leg.get_texts()) == 24 and len({t.get_text() for t in leg.get_texts()}) == 24
    plt.close(fig)

def test_a_bare_collector_and_a_debugger_see_a_checkpointed_forward_once():
    "The collector registered by hand as a forward hook and a debugger's own hook skip a checkpoint's recomputation too."
    from torch.utils.checkpoint import checkpoint
    from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
    from miniai.debuggers import FeatureMapDebugger
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    head = nn.Linear(4, 2)
    block[0]._hook_name = 'block.0'
    collector = ActivationStatisticsHook(StatisticsConfig(collect_percentiles=[]))
    class Counting(FeatureMapDebugger):
        calls = 0
        def process_forward(self, module, input, output):
            type(self).calls += 1
            return super().process_forward(module, input, output)
    dbg = Counting('0')
    for reentrant in (False, True):
        Counting.calls, collector.call_count = 0, 0
        h = block[0].register_forward_hook(collector)
        with dbg.attach(block):
            for _ in range(3):
                x = torch.randn(5, 4, requires_grad=True)
                head(checkpoint(block, x, use_reentrant=reentrant)).sum().backward()
        h.remove()
        assert (collector.call_count, Counting.calls) == (3, 3), (reentrant, collector.call_count, Counting.calls)
