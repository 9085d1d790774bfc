"""TensorBoardCB's steps: one count of training batches per run folder, across fits and callbacks; clear errors for what it cannot write."""
import pytest, torch, torch.nn.functional as F
from torch import nn
from miniai.datasets import DataLoaders
from miniai.learner import Learner, TrainCB
from miniai.activations import ActivationStats
from miniai.statistics import StatisticsCollector, StatisticsConfig
from miniai.monitoring import StatisticsCB
from miniai.tensorboard import TensorBoardCB, last_step
pytest.importorskip('tensorboard')
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

def dls(n=24, bs=8):   # 3 training batches
    g = torch.Generator().manual_seed(0)
    ds = list(zip(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)))
    return DataLoaders(torch.utils.data.DataLoader(ds, bs), torch.utils.data.DataLoader(ds, bs))

def learner(*cbs):
    torch.manual_seed(0)
    return Learner(nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)), dls(), F.cross_entropy, lr=0.1, cbs=[TrainCB(), *cbs])

def steps(log_dir, tag='activations/0.output/mean'):
    ea = EventAccumulator(str(log_dir), size_guidance={'scalars': 0}); ea.Reload()
    return sorted(e.step for e in ea.Scalars(tag))   # one event file per writer: files of one second sort by a per-process counter, '10' before '9'

def test_steps_go_on_across_fits(tmp_path):
    learn = learner(a := ActivationStats(['0']), tb := TensorBoardCB(tmp_path))
    learn.fit(2); learn.fit(1)
    assert steps(tmp_path) == list(range(9)) and tb.next_step == 9 and last_step(tmp_path) == 8

def test_every_keeps_batch_numbers_across_fits(tmp_path):
    learn = learner(ActivationStats(['0'], every=2), TensorBoardCB(tmp_path))
    learn.fit(1); learn.fit(1)
    assert steps(tmp_path) == [0, 2, 3, 5]   # batches 0 and 2 of each fit of 3, the second fit from step 3

def test_new_callback_on_a_folder_starts_after_its_last_step(tmp_path):
    learner(ActivationStats(['0']), TensorBoardCB(tmp_path)).fit(1)
    learner(ActivationStats(['0']), TensorBoardCB(tmp_path)).fit(1)
    assert steps(tmp_path) == list(range(6))
    learner(ActivationStats(['0']), TensorBoardCB(tmp_path/'other')).fit(1)   # a run of its own: a fresh folder starts at 0
    assert steps(tmp_path/'other') == [0, 1, 2]
    learner(ActivationStats(['0']), TensorBoardCB(tmp_path, prefix='acts')).fit(1)   # another prefix: its own count
    assert steps(tmp_path, 'acts/0.output/mean') == [0, 1, 2]

def test_start_step(tmp_path):
    learner(ActivationStats(['0']), TensorBoardCB(tmp_path, start_step=10)).fit(1)
    assert steps(tmp_path) == [10, 11, 12]

@pytest.mark.parametrize('astats', [object(), StatisticsConfig()], ids=['object', 'config'])
def test_what_holds_no_statistics_is_refused_clearly(astats, tmp_path):
    "Run-wide statistics (a collector, a StatisticsCB) are written now (tests/tensorboard/test_tensorboard_runwide.py); anything else is refused."
    with pytest.raises(TypeError, match='astats must be an ActivationStats.*a StatisticsCB or a StatisticsCollector'): TensorBoardCB(tmp_path, astats=astats)
    assert not tmp_path.joinpath('x').exists()

@pytest.mark.parametrize('kw,name', [({'start_step': -1}, 'start_step'), ({'start_step': 1.5}, 'start_step'), ({'start_step': True}, 'start_step'),
                                     ({'prefix': ''}, 'prefix'), ({'prefix': 3}, 'prefix')])
def test_bad_arguments(kw, name, tmp_path):
    with pytest.raises(ValueError, match=name): TensorBoardCB(tmp_path, **kw)

@pytest.mark.parametrize('every,expected', [(1, [0, 1, 2, 3, 4]), (2, [0, 2, 4])])
def test_a_loop_that_closes_and_writes_again_writes_each_batch_once(tmp_path, every, expected):
    "From a plain loop: 3 batches, write and close, 2 more, write and close: each training batch once, at its own step."
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    astats = ActivationStats(['0'], every=every)
    tb = TensorBoardCB(tmp_path, astats)
    with astats.attach(net):
        for _ in range(3): net(torch.randn(8, 4))
        tb.write(); tb.close()
        for _ in range(2): net(torch.randn(8, 4))
        tb.write(); tb.close()
    assert steps(tmp_path) == expected and tb.next_step == 5 + (every == 2)   # the next recorded batch: 5, or 6 with every=2
    means = EventAccumulator(str(tmp_path), size_guidance={'scalars': 0}); means.Reload()
    written = [e.value for e in sorted(means.Scalars('activations/0.output/mean'), key=lambda e: e.step)]
    assert written == pytest.approx(astats.series()['0'].means.tolist(), rel=1e-6)   # the batches' own numbers, in order
