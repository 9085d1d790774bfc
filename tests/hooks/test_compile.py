"""A torch.compile'd model: hooks attached after compiling record, each hook call one opaque `miniai::hook` op in the
compiled graph (no graph break), the numbers the very ones of the eager model; on exit the code compiled before comes back
(no recompile, nothing hooked). What compiled code cannot do is refused when attaching, saying what to do: a model compiled
in place (`nn.Module.compile`) and `output_grads=True`. The hooks run under the forward's grad mode, as in eager code,
so the parameters' gradients are recorded. Tiny models and dynamo's 'eager' / 'aot_eager' backends (no C++ compiler)."""
import warnings
import pytest, torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from miniai.hooks import HooksCallback, Hook, NothingRecordedWarning
from miniai.activations import ActivationStats
from miniai.datasets import DataLoaders
from miniai.learner import Learner, TrainCB

from _compiled import COMPILE_MARKS

pytestmark = COMPILE_MARKS

dynamo = pytest.importorskip('torch._dynamo')

def cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 8, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(32, 3))

XS = [torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]

def hooks_left(model): return [n for n, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks]

def train(model, run, cb):
    "Three SGD steps of `run` (the model, or its compiled wrapper) under `cb.attach(run)`."
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with cb.attach(run):
        for x in XS:
            F.cross_entropy(run(x), torch.zeros(len(x), dtype=torch.long)).backward()
            opt.step(); opt.zero_grad()
    return cb

def counters(): return dict(dynamo.utils.counters['stats']), sum(dynamo.utils.counters['graph_break'].values())

def test_attached_after_compiling_records_the_eager_numbers_without_graph_break():
    eager = train(m := cnn(), m, ActivationStats())
    m2 = cnn()
    cm = torch.compile(m2, backend='aot_eager')
    cm(XS[0])                                          # compiled before attaching: the usual order
    dynamo.utils.counters.clear()
    st = train(m2, cm, ActivationStats())
    stats, breaks = counters()
    assert breaks == 0 and stats['unique_graphs'] == 1  # the hooked forward compiled once, in one graph
    assert st.names == eager.names == ['0', '2', '5']
    for n in st.names:
        a, b = eager.recorders['train'][n]['output'], st.recorders['train'][n]['output']
        assert len(a) == len(b) == 3
        assert torch.equal(a.means, b.means) and torch.equal(a.stds, b.stds) and torch.equal(a.hists, b.hists)
    # on exit: nothing hooked, the code compiled before runs again (no new graph), and the op's hooks are gone
    assert not hooks_left(cm) and 'forward' in vars(cm)
    out = cm(XS[1])
    assert counters()[0]['unique_graphs'] == 1 and [len(st.recorders['train'][n]['output']) for n in st.names] == [3, 3, 3]
    assert torch.equal(out, m2(XS[1]))


def test_eager_backend_learner_and_a_compiled_part():
    # the Learner on a compiled model (backend 'eager'); the forward count and the report at the end as for an eager model
    m = cnn()
    cm = torch.compile(m, backend='eager')
    dl = DataLoader(TensorDataset(torch.cat(XS), torch.zeros(15, dtype=torch.long)), batch_size=5)
    seen = []
    cb = HooksCallback(lambda h, mod, inp, out: seen.append((h.name, out.shape)), layers=nn.Conv2d)
    with warnings.catch_warnings():
        warnings.simplefilter('error', NothingRecordedWarning)     # every hooked layer recorded
        Learner(cm, DataLoaders(dl, dl), F.cross_entropy, lr=0.1, cbs=[TrainCB(), cb]).fit(1)
    assert cb.calls == {'0': 3, '2': 3} and seen[:2] == [('0', (5, 4, 6, 6)), ('2', (5, 8, 2, 2))]
    assert not hooks_left(m)
    # a compiled layer inside an eager model: its hooks record as the others'
    outer = nn.Sequential(nn.Linear(6, 6), torch.compile(nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)), backend='eager'))
    outer[1](torch.randn(2, 6))
    cb = HooksCallback(lambda *a: None, layers=nn.Linear)
    with cb.attach(outer): outer(torch.randn(2, 6)); outer(torch.randn(2, 6))
    assert cb.calls == {'0': 2, '1.0': 2, '1.2': 2} and not hooks_left(outer)   # the compiled part's layers under the eager model's names


def test_hooks_registered_before_compiling_and_keyword_inputs():
    # attached first, compiled inside the block: the hooks traced as the op too (no graph break); after the block the
    # compiled code is guarded on the hooks, so the forward that follows is recompiled without them and records nothing
    m = cnn()
    cm = torch.compile(m, backend='eager')
    dynamo.utils.counters.clear()
    st = train(m, cm, ActivationStats())
    assert counters()[1] == 0 and [len(st.recorders['train'][n]['output']) for n in st.names] == [3, 3, 3]
    cm(XS[0])
    assert [len(st.recorders['train'][n]['output']) for n in st.names] == [3, 3, 3] and not hooks_left(m)
    # compiled in place inside the block: the phase hooks `attach` puts on the model are traced as the op too
    m3, cb = cnn(), HooksCallback(lambda *a: None, layers=nn.Conv2d)
    dynamo.utils.counters.clear()
    with cb.attach(m3):
        m3.compile(backend='eager'); m3(XS[0]); m3.eval()(XS[1]); m3.train()(XS[2])
    assert counters()[1] == 0 and cb.calls == {'0': 2, '2': 2}      # training forwards only, as in eager code
    # `with_kwargs` under compile: the keyword tensor reaches the hook as in eager code; a non-tensor input as None
    class Masked(nn.Module):
        def __init__(self): super().__init__(); self.lin = nn.Linear(4, 4)
        def forward(self, x, k=1, *, scale=None): return self.lin(x) * scale * k
    class Outer(nn.Module):
        def __init__(self): super().__init__(); self.inner = Masked()
        def forward(self, x): return self.inner(x, 1, scale=torch.full((1, 4), 2.))
    o = Outer()
    co = torch.compile(o, backend='eager')
    co(torch.randn(3, 4))
    got = []
    with Hook(o.inner, lambda h, mod, inp, out: got.append((len(inp), inp[1], sorted(inp.kwargs), inp.kwargs['scale'].sum().item())), with_kwargs=True):
        with HooksCallback(lambda *a: None, layers='inner').attach(co) as cb: co(torch.randn(3, 4))
    assert cb.calls == {'inner': 1} and got == [(2, None, ['scale'], 8.0)]


def test_hooks_run_under_the_forwards_grad_mode_and_param_grads_are_the_eager_ones():
    "Compiled code runs its graph without grad; the hooks it calls run as the forward would (grad on, or off under `torch.no_grad`), so that `ActivationStats(param_grads=True)` and the collector's `collect_param_grads` record the eager run's parameter gradients, with no graph break and one graph per grad mode."
    from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
    from miniai.param_book import NO_GRAD
    m = cnn()
    cm = torch.compile(m, backend='aot_eager')
    cm(XS[0])
    modes = []
    dynamo.utils.counters.clear()
    with HooksCallback(lambda h, mod, inp, out: modes.append(torch.is_grad_enabled()), layers='0').attach(cm):
        cm(XS[1])
        with torch.no_grad(): cm(XS[1])
        cm(XS[2])
    stats, breaks = counters()
    assert modes == [True, False, True] and breaks == 0 and stats['unique_graphs'] == 2   # the hooked forward with grad, then without
    def run(cb, compiled):
        m = cnn()
        run = torch.compile(m, backend='aot_eager') if compiled else m
        if compiled: run(XS[0])
        return train(m, run, cb)
    dynamo.utils.counters.clear()
    eager, comp = run(ActivationStats(param_grads=True), False), run(ActivationStats(param_grads=True), True)
    assert counters()[1] == 0
    want = eager.params(grads=True)
    assert sorted(want) == ['0.bias', '0.weight', '2.bias', '2.weight', '5.bias', '5.weight'] and len(want['0.weight']) == 3
    got = comp.params(grads=True)
    assert sorted(got) == sorted(want) and all('param_grad' not in comp.skipped[n] for n in comp.names)
    for k, rec in want.items():
        assert len(got[k]) == 3
        torch.testing.assert_close(got[k].means, rec.means, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got[k].stds, rec.stds, rtol=1e-4, atol=1e-6)
    eager, comp = (run(ActivationStatisticsHook(StatisticsConfig(collect_param_grads=True, collect_percentiles=[])), c) for c in (False, True))
    e, c = eager.export_statistics(), comp.export_statistics()
    for n in ('0', '2', '5'):
        assert 'param_grads_reason' not in c[n] and 'param_grads_reason' not in e[n]
        for pn in ('weight', 'bias'):
            a, b = e[n]['param_grads'][pn], c[n]['param_grads'][pn]
            assert a['count'] == b['count'] == 3 * m.get_parameter(f'{n}.{pn}').numel()
            assert b['mean'] == pytest.approx(a['mean'], rel=1e-4, abs=1e-6) and b['std'] == pytest.approx(a['std'], rel=1e-4, abs=1e-6)
    # training forwards under torch.no_grad: no `.grad` belongs to them, compiled as eagerly, and the reason says so
    for compiled in (False, True):
        m = cnn()
        run = torch.compile(m, backend='aot_eager') if compiled else m
        st, coll = ActivationStats(param_grads=True), ActivationStatisticsHook(StatisticsConfig(collect_param_grads=True, collect_percentiles=[]))
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', NothingRecordedWarning)
            with st.attach(run), coll.attach(run), torch.no_grad(): run(XS[0]); run(XS[1])
        assert st.params(grads=True) == {} and all(st.skipped[n]['param_grad'] == NO_GRAD for n in st.names), compiled
        assert all(coll.export_statistics()[n]['param_grads_reason'] == NO_GRAD for n in ('0', '2', '5')), compiled


def test_what_compiled_code_cannot_do_is_refused_when_attaching():
    m = cnn()
    cm = torch.compile(m, backend='eager')
    with pytest.raises(ValueError, match=r"ActivationStats: `output_grads=True` records gradients .* torch.compile does not call: record gradients with the uncompiled model"):
        with ActivationStats(output_grads=True).attach(cm): pass
    assert not hooks_left(m) and vars(cm)['forward'] is cm.forward
    m.compile(backend='eager')                       # compiled in place: no wrapper whose forward could be compiled afresh
    for cb in (ActivationStats(), HooksCallback(lambda *a: None)):
        with pytest.raises(ValueError, match=rf"{type(cb).__name__}: the model is compiled in place \(`nn.Module.compile`\).*compile with `torch.compile\(model\)` instead"):
            with cb.attach(m): pass
        assert not hooks_left(m) and not cb._sessions
    outer = nn.Sequential(nn.Linear(6, 6), nn.Linear(6, 3))
    outer[1].compile(backend='eager')
    with pytest.raises(ValueError, match=r"the model's layer '1' is compiled in place"): ActivationStats().attach(outer).__enter__()
    assert not hooks_left(outer)


def test_the_collector_records_a_compiled_model_that_already_ran_and_refuses_one_compiled_in_place():
    "Every recorder alike: a torch.compile wrapper that has run is recorded by the collector's attach (as by ActivationStats and StatisticsCB), with the same numbers as eager; `m.compile()` is refused by both, naming the fix."
    from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
    from miniai.activations import ActivationStats
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(16, 4)
    eager = ActivationStatisticsHook(StatisticsConfig())
    with eager.attach(m): m(x)
    comp = torch.compile(m, backend='eager'); comp(x)          # compiled, and run, before the hooks
    coll = ActivationStatisticsHook(StatisticsConfig())
    with coll.attach(comp): comp(x); comp(x)
    assert coll.call_count == 2 * 2 and not hooks_left(m)
    a, b = eager.get_statistics('0').output_stats, coll.get_statistics('0').output_stats
    assert b.count == 2 * a.count and b.mean == pytest.approx(a.mean, rel=1e-6)
    comp(x)                                                  # the compiled forward is back: no hook, nothing recorded
    assert coll.call_count == 4
    inplace = nn.Sequential(nn.Linear(4, 2)); inplace.compile(backend='eager'); inplace(x)
    for attach in (ActivationStatisticsHook(StatisticsConfig()).attach, ActivationStats().attach):
        with pytest.raises(ValueError, match=r"compiled in place \(`nn.Module.compile`\).*compile with `torch.compile\(model\)` instead"):
            with attach(inplace): pass
