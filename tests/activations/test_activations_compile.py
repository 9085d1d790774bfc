"""`ActivationStats` and a model compiled by `torch.compile` after `attach` (inside the block): every training forward recorded, the
numbers of the eager model, no "nothing was recorded"; and `param_grads` under compiled code: the hooks run under the forward's
grad mode, so the parameters' `.grad` is recorded with the eager numbers; training forwards under `torch.no_grad` owe none, and the
reason says so, as the run-wide collector does (tests/statistics/test_statistics_compile.py). dynamo's 'aot_eager' backend: no C++ compiler."""
import warnings
import pytest, torch
from torch import nn
from miniai.activations import ActivationStats
from miniai.hooks import NothingRecordedWarning
from miniai.param_book import NO_GRAD

pytestmark = [pytest.mark.usefixtures('one_thread'),
              pytest.mark.skipif(not hasattr(torch, 'compile') or not hasattr(torch.library, 'custom_op'),
                                 reason='this torch has no torch.compile or no torch.library.custom_op')]
dynamo = pytest.importorskip('torch._dynamo')

def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

XS = [torch.randn(16, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]

def record(compile_inside, **kw):
    m, st = net(), ActivationStats(**kw)
    with warnings.catch_warnings():
        warnings.simplefilter('error', NothingRecordedWarning)
        with st.attach(m):
            run = torch.compile(m, backend='aot_eager') if compile_inside else m     # compiled after attaching, inside the block
            for x in XS: run(x).sum().backward()
            with torch.no_grad(): run(XS[0])                                           # a training-mode forward without grad
    return st

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
        m, st = net(), ActivationStats(param_grads=True)
        with st.attach(m):
            run = torch.compile(m, backend='aot_eager') if compiled else m
            with torch.no_grad():
                for x in XS: run(x)
        assert len(st.recorders['train']['0']['output']) == 3 and st.params(grads=True) == {}
        assert all(st.skipped[n]['param_grad'] == NO_GRAD for n in st.names), compiled
