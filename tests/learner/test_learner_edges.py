"""The Learner at the edges: an empty training loader, an empty validation loader, and no learning rate
(`MomentumLearner`'s `lr=None`, as in the course). A real small model on real tensors."""
import math

import pytest, torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from miniai.datasets import DataLoaders
from miniai.learner import Learner, Callback, TrainCB, MetricsCB, MomentumLearner, TrainLearner, set_seed

pytestmark = pytest.mark.usefixtures('one_thread')   # see conftest.py


def data(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g))

def model():
    set_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))

class Events(Callback):
    def __init__(self): self.seen = []
    def before_fit(self, learn): self.seen.append('before_fit')
    def after_batch(self, learn): self.seen.append('batch')
    def cleanup_fit(self, learn): self.seen.append('cleanup_fit')


def test_an_empty_training_loader_is_refused_before_anything_runs():
    m = model(); before = [p.clone() for p in m.parameters()]
    ev, metrics = Events(), MetricsCB()
    metrics._log = lambda d: ev.seen.append(d)
    dls = DataLoaders(DataLoader(data(0), batch_size=4), DataLoader(data(8), batch_size=4))
    learn = Learner(m, dls, F.cross_entropy, lr=0.1, cbs=[TrainCB(), ev, metrics])
    with pytest.raises(ValueError, match=r'`dls.train`, the training DataLoader, is empty \(0 batches\)'): learn.fit(1)
    assert ev.seen == [] and all(torch.equal(p, q) for p, q in zip(m.parameters(), before))
    with pytest.raises(ValueError, match='training DataLoader'): learn.fit(2, cbs=[Events()])
    assert len(learn.cbs) == 3                            # the per-call callback was not left behind
    learn.fit(1, train=False)                             # validation only: nothing to refuse
    assert ev.seen[-1] == 'cleanup_fit' and ev.seen.count('batch') == 2
    learn.fit(0)                                          # no epoch: nothing to refuse either


def test_an_empty_validation_loader_logs_nan_not_a_made_up_loss():
    logs = []
    metrics = MetricsCB()
    metrics._log = logs.append
    dls = DataLoaders(DataLoader(data(8), batch_size=4), DataLoader(data(0), batch_size=4))
    Learner(model(), dls, F.cross_entropy, lr=0.1, cbs=[TrainCB(), metrics]).fit(1)
    train, valid = logs
    assert train['train'] == 'train' and math.isfinite(float(train['loss'])) and float(train['loss']) > 0
    assert valid['train'] == 'eval' and valid['loss'] == 'nan'


def test_no_learning_rate_is_a_clear_error_and_fit_or_lr_find_can_give_one():
    dls = DataLoaders(DataLoader(data(16), batch_size=4), DataLoader(data(8), batch_size=4))
    ev = Events()
    learn = MomentumLearner(model(), dls, F.cross_entropy, cbs=[ev])        # the course's default: lr=None
    with pytest.raises(ValueError, match='MomentumLearner.fit: no learning rate: pass `lr`'): learn.fit(1)
    assert ev.seen == []
    with pytest.raises(ValueError, match='no learning rate'): Learner(model(), dls, F.cross_entropy, lr=None).fit(1)
    learn.fit(1, lr=0.05)                                                   # lr at fit time, as in the course
    assert learn.opt.param_groups[0]['lr'] == 0.05 and ev.seen.count('batch') == 6
    learn.lr_find(max_epochs=1)                                             # lr_find brings its own start_lr
    assert learn.lr_finder.lrs[0] == 1e-5
    Learner(model(), dls, F.cross_entropy, lr=None, cbs=[TrainCB()], opt_func=None).fit(1, train=False)   # no optimiser, no lr needed


@pytest.mark.parametrize('bad', [1.5, '2', -1, None, True])
def test_a_bad_epoch_count_is_refused_before_anything_runs(bad):
    m = model(); before = [p.clone() for p in m.parameters()]
    ev = Events()
    learn = Learner(m, DataLoaders(DataLoader(data(8), batch_size=4), DataLoader(data(4), batch_size=4)), F.cross_entropy, lr=0.1,
                    cbs=[TrainCB(), ev])
    with pytest.raises(ValueError, match=r'Learner\.fit: `n_epochs` must be an integer >= 0'): learn.fit(bad)
    assert ev.seen == [] and all(torch.equal(p, q) for p, q in zip(m.parameters(), before))
    learn.fit(1)                                          # the same learner still trains
    assert ev.seen.count('batch') == 3


def test_a_failing_cleanup_note_names_the_callbacks_line():
    "`run_cleanup_cbs` runs `run_cbs` one callback at a time: the note points at the callback's own line, not at the loop."
    from miniai.learner import run_cleanup_cbs
    class Fails(Callback):
        def cleanup_fit(self, learn): raise OSError('disk full')
    class Releases(Callback):
        def cleanup_fit(self, learn): self.released = True
    first, second, last = Fails(), Fails(), Releases()
    with pytest.raises(OSError) as e: run_cleanup_cbs([first, second, last], 'cleanup_fit', 'learner')
    assert last.released and first.learn == 'learner' == last.learn
    note = e.value.__notes__[1]
    line = Fails.cleanup_fit.__code__.co_firstlineno
    assert note.startswith('Fails.cleanup_fit also raised OSError: disk full') and note.endswith(f'(test_learner_edges.py:{line})'), note
