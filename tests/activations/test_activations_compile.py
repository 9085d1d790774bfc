"""`ActivationStats` and a model compiled by `torch.compile` after `attach` (inside the block): every training forward recorded, the
numbers of the eager model, no "nothing was recorded"; and `param_grads` under compiled code: the hooks run under the forward's
grad mode, so the parameters' `.grad` is recorded with the eager numbers; training forwards under `torch.no_grad` owe none, and the
reason says so, as the run-wide collector does (tests/statistics/test_statistics_compile.py). dynamo's 'aot_eager' backend: no C++ compiler."""
import warnings
import pytest, torch
from miniai.activations import ActivationStats
from miniai.hooks import NothingRecordedWarning
from miniai.param_book import NO_GRAD
from _compiled import COMPILE_MARKS, run_attached

pytestmark = COMPILE_MARKS
dynamo = pytest.importorskip('torch._dynamo')

def record(compiled, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter('error', NothingRecordedWarning)
        return run_attached(ActivationStats(**kw), compiled)

def test_compiled_after_attach_records_the_eager_numbers():
    dynamo.reset()
    eager, comp = record(False), record(True)
    assert comp.names == eager.names == ['0', '2']
    for n in eager.names:
        a, b = eager.recorders['train'][n]['output'], comp.recorders['train'][n]['output']
        assert len(a) == len(b) == 4
        torch.testing.assert_close(b.means, a.means); torch.testing.assert_close(b.stds, a.stds)
        assert torch.equal(a.moments.count, b.moments.count)

def test_param_grads_under_compile_are_the_eager_ones():
    dynamo.reset()
    eager, comp = record(False, param_grads=True), record(True, param_grads=True)
    want, got = eager.params(grads=True), comp.params(grads=True)
    assert sorted(got) == sorted(want) == ['0.bias', '0.weight', '2.bias', '2.weight']
    for k, rec in want.items():     # three backwards: the no-grad forward owes nothing
        assert len(rec) == len(got[k]) == 3
        torch.testing.assert_close(got[k].means, rec.means, rtol=1e-4, atol=1e-6); torch.testing.assert_close(got[k].stds, rec.stds, rtol=1e-4, atol=1e-6)
    assert all('param_grad' not in st.skipped[n] for st in (eager, comp) for n in st.names)

def test_param_grads_of_forwards_without_grad_say_why():
    "Training forwards under `torch.no_grad` only: no `.grad` belongs to them, compiled or not, and the reason says so layer by layer (not a missing backward)."
    dynamo.reset()
    for compiled in (False, True):
        st = run_attached(ActivationStats(param_grads=True), compiled, backward=False)
        assert len(st.recorders['train']['0']['output']) == 3 and st.params(grads=True) == {}
        assert all(st.skipped[n]['param_grad'] == NO_GRAD for n in st.names), compiled
