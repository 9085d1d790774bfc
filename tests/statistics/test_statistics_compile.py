"""The run-wide collector and a model compiled by `torch.compile` after `attach` (inside the block): every training call recorded with
the eager numbers; and `collect_param_grads` under compiled code: the hooks run under the forward's grad mode, so the parameters'
`.grad` is recorded with the eager numbers; calls under `torch.no_grad` owe none, and the export's reason says so, as
`ActivationStats` does (tests/activations/test_activations_compile.py)."""
import warnings, math
import pytest, torch
from torch import nn
from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
from miniai.param_book import NO_GRAD

pytestmark = [pytest.mark.usefixtures('one_thread'),
              pytest.mark.skipif(not hasattr(torch, 'compile') or not hasattr(torch.library, 'custom_op'),
                                 reason='this torch has no torch.compile or no torch.library.custom_op')]
dynamo = pytest.importorskip('torch._dynamo')

def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

XS = [torch.randn(16, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]

def collect(compile_inside, **kw):
    m, coll = net(), ActivationStatisticsHook(StatisticsConfig(collect_percentiles=[], **kw))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        with coll.attach(m):
            run = torch.compile(m, backend='aot_eager') if compile_inside else m     # compiled after attaching, inside the block
            for x in XS: run(x).sum().backward()
            with torch.no_grad(): run(XS[0])                                           # a training-mode call without grad
    return coll

def test_compiled_after_attach_records_the_eager_numbers():
    dynamo.reset()
    eager, comp = collect(False), collect(True)
    assert comp.call_count == eager.call_count == 2 * 4
    for n in ('0', '2'):
        for part in ('input_stats', 'output_stats'):
            a, b = getattr(eager.get_statistics(n), part), getattr(comp.get_statistics(n), part)
            assert a.count == b.count == 4 * 16 * (4 if n == '0' and part == 'input_stats' else 8 if n != '2' or part == 'input_stats' else 2)
            assert math.isclose(a.mean, b.mean, rel_tol=1e-5, abs_tol=1e-7) and math.isclose(a.std, b.std, rel_tol=1e-5)

def test_param_grads_under_compile_are_the_eager_ones():
    dynamo.reset()
    eager, comp = collect(False, collect_param_grads=True), collect(True, collect_param_grads=True)
    e, c = eager.export_statistics(), comp.export_statistics()
    assert e['0']['param_grads']['weight']['count'] == 3 * 32        # three backwards: the no-grad call owes nothing
    for n in ('0', '2'):
        assert 'param_grads_reason' not in c[n] and sorted(c[n]['param_grads']) == ['bias', 'weight']
        for pn in ('weight', 'bias'):
            a, b = e[n]['param_grads'][pn], c[n]['param_grads'][pn]
            assert a['count'] == b['count'] and math.isclose(a['mean'], b['mean'], rel_tol=1e-5, abs_tol=1e-7)
            assert math.isclose(a['std'], b['std'], rel_tol=1e-5, abs_tol=1e-7)

def test_param_grads_of_calls_without_grad_say_why():
    "Training calls under `torch.no_grad` only, compiled or not: no `.grad` belongs to them, and the export's reason says so, not \"no backward\"."
    dynamo.reset()
    for compiled in (False, True):
        m, coll = net(), ActivationStatisticsHook(StatisticsConfig(collect_percentiles=[], collect_param_grads=True))
        with coll.attach(m):
            run = torch.compile(m, backend='aot_eager') if compiled else m
            with torch.no_grad():
                for x in XS: run(x)
        e = coll.export_statistics()
        assert coll.call_count == 2 * 3 and all(e[n]['param_grads_reason'] == NO_GRAD for n in ('0', '2')), compiled

def test_every_counts_the_compiled_models_batches():
    "`every=2` under compile-after-attach: batches 1 and 3 of the four calls, as eagerly (the model's phase hook runs inside the compiled code too)."
    dynamo.reset()
    eager, comp = collect(False, every=2), collect(True, every=2)
    for c in (eager, comp):
        st = c.get_statistics('0')
        assert (st.calls, st.n_updates, st.output_stats.count) == (4, 2, 2 * 16 * 8)
    assert math.isclose(eager.get_statistics('2').output_stats.mean, comp.get_statistics('2').output_stats.mean, rel_tol=1e-5, abs_tol=1e-7)
