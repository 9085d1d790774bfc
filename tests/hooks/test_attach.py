"""`HooksCallback.attach` and `ActivationStats` at the edges: nested and overlapping recordings, layers of another model,
hooked models that deep-copy and save, `paused_recording()`, and the user's tensors left bit-identical.
Real small models trained for a few steps; every check compares with what the same model does without hooks."""
import copy, io, math

import pytest, torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import miniai.kernel
from miniai.core import paused_recording
from miniai.datasets import DataLoaders
from miniai.hooks import HooksCallback, HookFn, select_modules, _inert
from miniai.learner import Learner, Callback, TrainCB
from miniai.activations import ActivationStats

pytestmark = pytest.mark.usefixtures('one_thread')   # see conftest.py


def mlp(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3)).to(dtype)

def data(n=32, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g, dtype=dtype), torch.randint(0, 3, (n,), generator=g)

def dls(n_train=4, bs=8):
    x, y = data(n_train * bs)
    return DataLoaders(DataLoader(TensorDataset(x, y), batch_size=bs), DataLoader(TensorDataset(x[:bs], y[:bs]), batch_size=bs))

def counts(cb): return [len(h.stats[0]) for h in cb]

def hooks_left(model): return [n for n, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks]

def step(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss


# nested attach, fit inside attach, two models at once

def test_nested_attach_of_the_same_model_records_each_forward_once():
    model, (x, y) = mlp(), data()
    a = ActivationStats()
    with a.attach(model):
        step(model, x, y)
        with a.attach(model):                 # joins: no new hooks, nothing reset
            step(model, x, y)
            assert counts(a) == [2, 2, 2]
        step(model, x, y)                     # the outer block still records after the inner one ended
        assert hooks_left(model)
    assert counts(a) == [3, 3, 3] and not hooks_left(model)
    assert a.hooks[0].stats[0].shape == (3,)


def test_fit_inside_attach_records_every_batch_once_and_keeps_the_earlier_ones():
    model, d = mlp(), dls(n_train=4)
    a = ActivationStats(every=2)
    with a.attach(model):
        step(model, *data())                                    # forward 1: recorded (every=2 counts forwards 1, 3, 5...)
        Learner(model, d, F.cross_entropy, lr=0.1, cbs=[TrainCB(), a]).fit(1, valid=False)   # forwards 2-5: 3 and 5 recorded
        assert hooks_left(model), "the fit's cleanup removed the hooks of the block it joined"
        step(model, *data())                                    # forward 6: not recorded; 7 would be
        step(model, *data())
    assert counts(a) == [4, 4, 4] and not hooks_left(model)


def test_attach_and_fit_on_a_second_model_are_refused_and_the_first_keeps_recording():
    model, other, (x, y) = mlp(), mlp(1), data()
    a = ActivationStats()
    with a.attach(model):
        step(model, x, y)
        with pytest.raises(ValueError, match='already recording a Sequential.*use a second ActivationStats'):
            with a.attach(other): pass
        with pytest.raises(ValueError, match='already recording'):
            Learner(other, dls(), F.cross_entropy, lr=0.1, cbs=[TrainCB(), a]).fit(1)
        assert not hooks_left(other)
        step(model, x, y)
    assert counts(a) == [2, 2, 2] and not hooks_left(model)
    with a.attach(other): step(other, x, y)    # once the block ended, the callback may hook another model (afresh)
    assert counts(a) == [1, 1, 1]


def test_layers_of_another_model_are_refused_naming_layers():
    model, other = mlp(), mlp(1)
    with pytest.raises(ValueError, match=r'layers: item 1 \(Linear\) is not a module of this Sequential'):
        select_modules(model, [model[0], other[2]])
    a = ActivationStats(layers=[other[0]])
    with pytest.raises(ValueError, match='layers: item 0'):
        with a.attach(model): pass
    with pytest.raises(ValueError, match='layers: item 0'):
        Learner(model, dls(), F.cross_entropy, lr=0.1, cbs=[TrainCB(), a]).fit(1)
    assert not hooks_left(model) and not hooks_left(other)
    assert [n for n, _ in select_modules(model, [model[2], model[0]])] == ['2', '0']   # the model's own modules, by their names


# a hooked model deep-copies and saves

class CopyCB(Callback):
    "At each training batch's end, copy the model as an EMA or keep-the-best callback would, and save it."
    order = 5
    def __init__(self): self.copies, self.saved = [], []
    def after_batch(self, learn):
        if not learn.training: return
        self.copies.append(copy.deepcopy(learn.model))
        buf = io.BytesIO(); torch.save(learn.model, buf); buf.seek(0)
        self.saved.append(torch.load(buf, weights_only=False))

def forwards_of(model):
    return [f for m in model.modules() for d in (m._forward_hooks, m._forward_pre_hooks) for f in d.values()]

@pytest.mark.parametrize('grads', [False, True])
def test_a_model_copied_and_saved_inside_fit_records_nothing(grads):
    model = mlp()
    a, cp = ActivationStats(output_grads=grads), CopyCB()
    Learner(model, dls(n_train=3), F.cross_entropy, lr=0.1, cbs=[TrainCB(), a, cp]).fit(1, valid=False)
    assert counts(a) == [3, 3, 3]
    x, y = data()
    for twin in cp.copies + cp.saved:
        assert forwards_of(twin) and all(f is _inert for f in forwards_of(twin))   # inert stand-ins, not miniai's hooks
        step(twin, x, y)
    assert counts(a) == [3, 3, 3], 'a copy recorded into the original callback'
    assert torch.equal(cp.copies[-1](x), cp.saved[-1](x))
    assert not hooks_left(model)

@pytest.mark.parametrize('grads', [False, True])
def test_a_model_copied_and_saved_inside_attach(grads):
    model, plain, (x, y) = mlp(), mlp(), data()
    a = ActivationStats(output_grads=grads)
    with a.attach(model):
        step(model, x, y)
        twin = copy.deepcopy(model)
        buf = io.BytesIO(); torch.save(model, buf); buf.seek(0); saved = torch.load(buf, weights_only=False)
        assert all(isinstance(f, HookFn) for f in forwards_of(model)) and all(f is _inert for f in forwards_of(twin) + forwards_of(saved))
        out_twin, out_saved = step(twin, x, y), step(saved, x, y)
        assert counts(a) == [1, 1, 1]
        step(model, x, y)                                    # the original keeps recording
    assert counts(a) == [2, 2, 2]
    step(plain, x, y)
    assert torch.equal(out_twin, step(plain, x, y)) and torch.equal(out_saved, out_twin)   # two steps' grads, same numbers
    if grads: assert len(a.hooks[0].recorders['output_grad']) == 2
    twin(x); assert counts(a) == [2, 2, 2]


# paused_recording()

def test_paused_forwards_record_nothing_and_are_not_counted_by_every():
    model, (x, y) = mlp(), data()
    a = ActivationStats(every=2, output_grads=True)
    with a.attach(model):
        step(model, x, y)                      # forward 1: recorded
        with paused_recording(): step(model, x, y); step(model, x, y)   # neither recorded nor counted
        step(model, x, y)                      # forward 2: skipped by every=2
        step(model, x, y)                      # forward 3: recorded
        loss = F.cross_entropy(model(x), y)    # forward 4: not recorded
        assert counts(a) == [2, 2, 2]
    assert a._n_train == 4 and len(a.hooks[0].recorders['output_grad']) == 2
    # a backward run while recording is paused records no gradient either
    b = ActivationStats(output_grads=True)
    with b.attach(model):
        loss = F.cross_entropy(model(x), y)
        with paused_recording(): loss.backward()
        step(model, x, y)
    assert counts(b) == [2, 2, 2] and len(b.hooks[0].recorders['output_grad']) == 1


def test_paused_batches_of_a_fit_are_not_counted():
    class PauseSecond(Callback):
        "Pauses recording around the second training batch (a calibration forward, say)."
        order = -1
        def before_batch(self, learn):
            if learn.iter == 1: self.ctx = paused_recording(); self.ctx.__enter__()
        def after_batch(self, learn):
            if learn.iter == 1: self.ctx.__exit__(None, None, None)
    model = mlp()
    a = ActivationStats(every=2)
    Learner(model, dls(n_train=4), F.cross_entropy, lr=0.1, cbs=[TrainCB(), a, PauseSecond()]).fit(1, valid=False)
    assert counts(a) == [2, 2, 2] and a._n_train == 3   # batches 0, 2, 3 counted; 0 and 3 recorded


# the user's tensors stay bit-identical

@pytest.fixture(params=[True, False], ids=['fused', 'torch-ops'])
def kernel_path(request, monkeypatch):
    monkeypatch.setenv('MINIAI_KERNEL', 'loops' if request.param else 'torch')    # every thread, the backward's too
    yield request.param

@pytest.mark.parametrize('grads', [False, True])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_activation_stats_leaves_inputs_outputs_and_gradients_bit_identical(kernel_path, dtype, grads):
    hooked, plain = mlp(3, dtype), mlp(3, dtype)
    x, y = data(dtype=dtype)
    x = x * 4                                  # activations past the first histogram bins, some in the overflow bin
    x_before = x.clone()
    a = ActivationStats(output_grads=grads, layers=(nn.Linear, nn.ReLU))
    seen = {}
    def keep(name):   # registered after miniai's hooks: what the next layer and the user see
        return lambda m, i, o: seen.setdefault(name, []).append(o.detach().clone())
    with a.attach(hooked):
        for n, m in hooked.named_children(): m.register_forward_hook(keep(n))
        out = hooked(x); out.retain_grad()
        F.cross_entropy(out, y).backward()
    for m in hooked.children(): m._forward_hooks.clear()
    assert counts(a) == [1] * 5 and (not grads or len(a.hooks[-1].recorders['output_grad']) == 1)
    ref_out = x.clone().requires_grad_(False)
    ref_acts = {}
    for n, m in plain.named_children():
        ref_out = m(ref_out); ref_acts[n] = ref_out.detach().clone()
    ref_out.retain_grad()
    F.cross_entropy(ref_out, y).backward()
    assert torch.equal(x, x_before)
    assert all(torch.equal(seen[n][0], ref_acts[n]) for n in ref_acts)
    assert torch.equal(out, ref_out) and torch.equal(out.grad, ref_out.grad)
    for (n, p), q in zip(hooked.named_parameters(), plain.parameters()):
        assert torch.equal(p.grad, q.grad), f'{n}.grad changed'


# diagnose's `tail`

def test_diagnose_refuses_a_tail_that_is_not_a_fraction():
    model, (x, y) = mlp(), data()
    a = ActivationStats()
    with a.attach(model):
        for _ in range(4): step(model, x, y)
    for bad in (math.nan, 0, -0.5, 1.5, math.inf, True, '0.1', None):
        with pytest.raises(ValueError, match='`tail`'): a.diagnose(tail=bad)
    assert len(a.diagnose(tail=1)) == 3 and len(a.diagnose(tail=0.01)) == 3   # all batches; the last one
    assert counts(a) == [4, 4, 4]
