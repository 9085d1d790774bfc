"""The run-wide collector and a model compiled by `torch.compile` after `attach` (inside the block): every training call recorded with
the eager numbers; and `collect_param_grads` under compiled code: the hooks run under the forward's grad mode, so the parameters'
`.grad` is recorded with the eager numbers; calls under `torch.no_grad` owe none, and the export's reason says so, as
`ActivationStats` does (tests/activations/test_activations_compile.py)."""
import warnings, math
import pytest, torch
from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
from miniai.param_book import NO_GRAD
from _compiled import COMPILE_MARKS, run_attached

pytestmark = COMPILE_MARKS
dynamo = pytest.importorskip('torch._dynamo')

def collect(compiled, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        return run_attached(ActivationStatisticsHook(StatisticsConfig(collect_percentiles=[], **kw)), compiled)

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
        coll = run_attached(ActivationStatisticsHook(StatisticsConfig(collect_percentiles=[], collect_param_grads=True)), compiled, backward=False)
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
