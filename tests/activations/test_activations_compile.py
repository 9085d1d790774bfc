"""`ActivationStats` and a model compiled by `torch.compile` after `attach` (inside the block): every training forward recorded, the
numbers of the eager model, no "nothing was recorded"; and `param_grads` under compiled code: the parameters' `.grad` recorded, or
(where compiled code runs the hooks without grad, so no `.grad` can be told to belong to a recorded forward) a reason saying so,
as the run-wide collector does (tests/statistics/test_statistics_compile.py). dynamo's 'aot_eager' backend: no C++ compiler."""
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
        a, b = eager.recorders['train'][n]['0'], comp.recorders['train'][n]['0']
        assert len(a) == len(b) == 4
        torch.testing.assert_close(b.means, a.means); torch.testing.assert_close(b.stds, a.stds)
        assert torch.equal(a.moments.count, b.moments.count)

def test_param_grads_under_compile_recorded_or_said_why():
    dynamo.reset()
    eager, comp = record(False, param_grads=True), record(True, param_grads=True)
    assert len(eager.params(grads=True)['0.weight']) == 3 and 'grad.param' not in eager.skipped['0']   # the no-grad forward owes nothing
    got = comp.params(grads=True)
    if got:     # compiled code that runs the hooks with the forward's grad mode: the very gradients of the eager run
        assert sorted(got) == sorted(eager.params(grads=True))
        for k, rec in got.items(): torch.testing.assert_close(rec.means, eager.params(grads=True)[k].means)
    else:       # else refused with the reason, layer by layer, not blamed on a missing backward
        assert all(comp.skipped[n]['grad.param'] == NO_GRAD for n in comp.names)
        assert 'torch.compile' in NO_GRAD and 'eagerly' in NO_GRAD
