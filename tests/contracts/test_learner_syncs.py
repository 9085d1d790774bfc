"""The Learner's metrics and progress callbacks read at most one value from the device per batch.

Counted with miniai.testing.count_syncs (scalar reads, .cpu(), .tolist(), .numpy()) over real training
batches of the baseline CNN on FashionMNIST. The DataLoader's sampler itself reads 3 host-side values per epoch."""
import torch.nn.functional as F
from torcheval.metrics import MulticlassAccuracy
from miniai.datasets import fashion_dls
from miniai.learner import Learner, TrainCB, MetricsCB, ProgressCB, Callback, CancelFitException, baseline_cnn, set_seed
from miniai.testing import count_syncs

N = 6

class StopAfter(Callback):
    order = 10   # after every other callback's after_batch
    def after_batch(self, learn):
        if learn.iter == N - 1: raise CancelFitException()

def syncs(extra):
    set_seed(0)
    dls = fashion_dls(256)
    with count_syncs() as cs:
        Learner(baseline_cnn(), dls, F.cross_entropy, lr=0.1, cbs=[TrainCB(), StopAfter()] + extra).fit(1, valid=False)
    return cs.n

def test_metrics_add_no_sync_per_batch():
    assert syncs([MetricsCB(accuracy=MulticlassAccuracy())]) == syncs([])

def test_progress_adds_one_sync_per_batch():
    base = syncs([])
    assert syncs([MetricsCB(accuracy=MulticlassAccuracy()), ProgressCB()]) - base == N
