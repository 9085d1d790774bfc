"""The Learner's cleanup stage when something fails: every callback's cleanup runs, no hook stays on the model,
the model can be freed, and the error the user sees is the right one.
Real FashionMNIST images, lesson 10's baseline CNN and lesson 10's `ActivationStats`."""
import gc, weakref
from pathlib import Path

import pytest, torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from miniai.datasets import fashion_mnist_dir, read_fashion_split, DataLoaders
from miniai.learner import Learner, Callback, TrainCB, CancelFitException, baseline_cnn, set_seed, run_cbs, run_cleanup_cbs
from miniai.activations import ActivationStats

@pytest.fixture(scope='module')
def dls():
    folder = fashion_mnist_dir()
    if folder is None: pytest.skip('FashionMNIST IDX files not installed')
    imgs, lbls = read_fashion_split(folder, 'test')
    x = torch.tensor(imgs[:512]).float().div(255).unsqueeze(1)
    y = torch.tensor(lbls[:512]).long()
    return DataLoaders(DataLoader(TensorDataset(x[:384], y[:384]), batch_size=64),
                       DataLoader(TensorDataset(x[384:], y[384:]), batch_size=64))

class SaveCB(Callback):
    "Saves its results at the end of fit, to a place that cannot be written: a real `OSError`."
    order = -1                       # runs before ActivationStats' cleanup
    fn = Path('/proc/miniai-no-such-folder/results.json')
    def cleanup_fit(self, learn): self.fn.write_text('{}')

class BoomCB(Callback):
    def __init__(self, exc, at=2): self.exc, self.at = exc, at
    def after_batch(self, learn):
        if learn.iter == self.at: raise self.exc

def hooks_left(model): return [name for name, m in model.named_modules() if m._forward_hooks or m._backward_hooks]

def failing_fit(dls, extra_cbs, expected):
    "Fit the baseline with ActivationStats and `extra_cbs`; returns the raised error, a weakref to the model and the stats callback."
    set_seed(0)
    model = baseline_cnn()
    astats = ActivationStats(lambda m: isinstance(m, torch.nn.Conv2d))
    learn = Learner(model, dls, loss_func=F.cross_entropy, lr=0.1, cbs=[TrainCB(), astats, *extra_cbs])
    with pytest.raises(expected) as info: learn.fit(1)
    err = info.value
    assert hooks_left(model) == [], hooks_left(model)
    ref = weakref.ref(model)
    err.__traceback__ = None; del info, learn, model    # drop everything of ours that holds the frames
    return err, ref, astats

def test_cleanup_error_after_a_good_fit(dls):
    err, ref, astats = failing_fit(dls, [SaveCB()], OSError)
    assert isinstance(err, FileNotFoundError) and 'miniai-no-such-folder' in str(err)
    assert any('SaveCB.cleanup_fit' in n for n in err.__notes__), err.__notes__
    assert astats.learn is None                     # ActivationStats' cleanup ran after SaveCB's failed
    assert len(astats.hooks[0].recorders['output']) == 6  # and what it collected is kept: 6 training batches
    del err; gc.collect()
    assert ref() is None, 'the model is still alive'

def test_fit_error_wins_over_cleanup_error(dls):
    boom = RuntimeError('boom in batch 2')
    err, ref, astats = failing_fit(dls, [SaveCB(), BoomCB(boom)], RuntimeError)
    assert err is boom
    notes = '\n'.join(err.__notes__)
    assert 'SaveCB.cleanup_fit also raised FileNotFoundError' in notes and 'miniai-no-such-folder' in notes, notes
    assert astats.learn is None and len(astats.hooks[0].recorders['output']) == 3   # batches 0, 1, 2
    del err, boom; gc.collect()
    assert ref() is None, 'the model is still alive'

def test_keyboard_interrupt_wins_too(dls):
    ctrl_c = KeyboardInterrupt()
    err, ref, astats = failing_fit(dls, [SaveCB(), BoomCB(ctrl_c, at=0)], KeyboardInterrupt)
    assert err is ctrl_c and any('SaveCB.cleanup_fit' in n for n in err.__notes__)
    del err, ctrl_c; gc.collect()
    assert ref() is None

def test_two_cleanups_fail(dls):
    class Other(SaveCB):
        order = 5                                    # after ActivationStats
        fn = Path('/proc/miniai-other/x')
    err, ref, astats = failing_fit(dls, [SaveCB(), Other(), BoomCB(CancelFitException())], OSError)
    assert 'miniai-no-such-folder' in str(err)        # the first in callback order is raised
    assert any('Other.cleanup_fit also raised FileNotFoundError' in n and 'miniai-other' in n for n in err.__notes__), err.__notes__
    assert astats.learn is None

def test_cleanup_batch_runs_for_all(dls):
    "A per-batch cleanup that fails does not keep a later callback from detaching its per-batch hook."
    class AttachPerBatch(Callback):
        order = 1
        def before_batch(self, learn): self.h = learn.model[0].register_forward_hook(lambda *a: None)
        def cleanup_batch(self, learn): self.h.remove()
    class FailBatchCleanup(Callback):
        def cleanup_batch(self, learn): raise ValueError('cleanup_batch failed')
    model = baseline_cnn()
    learn = Learner(model, dls, loss_func=F.cross_entropy, cbs=[TrainCB(), FailBatchCleanup(), AttachPerBatch()])
    with pytest.raises(ValueError, match='cleanup_batch failed'): learn.fit(1)
    assert hooks_left(model) == []

def test_run_cbs_still_stops_at_the_first_error():
    "The per-event path is unchanged: an error in `after_batch` stops the other callbacks' `after_batch`."
    seen = []
    class A(Callback):
        order = 0
        def after_batch(self): raise CancelFitException()
    class B(Callback):
        order = 1
        def after_batch(self): seen.append('B')
    with pytest.raises(CancelFitException): run_cbs([A(), B()], 'after_batch')
    assert seen == []
    with pytest.raises(CancelFitException): run_cleanup_cbs([A(), B()], 'after_batch')
    assert seen == ['B']
