"""TensorBoardCB beyond a Learner's per-batch ActivationStats: validation batches under tags of their own, run-wide statistics
(StatisticsCB, StatisticsCollector) as scalars per layer at each write, and a plain training loop without a Learner. Real event files read back."""
import pytest, torch, torch.nn.functional as F
from torch import nn
from miniai.datasets import DataLoaders
from miniai.learner import Learner, TrainCB
from miniai.activations import ActivationStats
from miniai.statistics import StatisticsConfig, ActivationStatisticsHook
from miniai.monitoring import StatisticsCB
from miniai.tensorboard import TensorBoardCB
pytest.importorskip('tensorboard')
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

def dls(n=24, bs=8):   # 3 training batches, 3 validation batches
    g = torch.Generator().manual_seed(0)
    ds = list(zip(torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)))
    return DataLoaders(torch.utils.data.DataLoader(ds, bs), torch.utils.data.DataLoader(ds, bs))

def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))

def events(log_dir, tag):
    ea = EventAccumulator(str(log_dir), size_guidance={'scalars': 0}); ea.Reload()
    if tag not in ea.Tags()['scalars']: return [], []
    ev = ea.Scalars(tag)
    return [e.step for e in ev], [e.value for e in ev]

def test_training_and_validation_are_separate_tags(tmp_path):
    astats = ActivationStats(['0'], on_valid=True)
    Learner(model(), dls(), F.cross_entropy, lr=0.1, cbs=[TrainCB(), astats, TensorBoardCB(tmp_path)]).fit(2)
    steps, vals = events(tmp_path, 'activations/0.output/mean')
    assert steps == list(range(6))                                           # 2 epochs of 3 training batches
    assert vals == pytest.approx(astats.series('train')['0'].means.tolist(), rel=1e-6)
    vsteps, vvals = events(tmp_path, 'activations_valid/0.output/mean')
    assert vsteps == list(range(6))                                          # 2 epochs of 3 validation batches, numbered apart
    assert vvals == pytest.approx(astats.series('valid')['0'].means.tolist(), rel=1e-6)

def test_statistics_cb_writes_run_wide_scalars_after_each_epoch(tmp_path):
    cb = StatisticsCB(StatisticsConfig(collect_sparsity=True, collect_percentiles=[50, 99], collect_input=False), layers=['0', '1'])
    learn = Learner(model(), dls(), F.cross_entropy, lr=0.1, cbs=[TrainCB(), cb, TensorBoardCB(tmp_path)])   # found among the callbacks
    learn.fit(2)
    steps, vals = events(tmp_path, 'activations/1.output/sparsity')
    assert steps == [2, 5]                                                    # the last training batch of each epoch
    st = cb.stats.get_all_statistics()
    assert vals[-1] == pytest.approx(st['1'].output_stats.sparsity_ratio, rel=1e-6)
    for k in ('mean', 'std', 'min', 'max', 'count', 'nonfinite', 'p50', 'p99'): assert events(tmp_path, f'activations/0.output/{k}')[0] == [2, 5], k
    assert events(tmp_path, 'activations/0.output/count')[1][-1] == st['0'].output_stats.count == 6 * 8 * 5

def test_collector_from_a_plain_loop(tmp_path):
    "No Learner: a collector attached to the model, `write(step)` as the loop goes, `close()` at the end of the `with` block."
    net, coll = model(), ActivationStatisticsHook(StatisticsConfig(collect_input=False))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    means = []
    with coll.attach(net, nn.Linear), TensorBoardCB(tmp_path, coll) as tb:
        for step, (xb, yb) in enumerate(dls().train):
            F.cross_entropy(net(xb), yb).backward(); opt.step(); opt.zero_grad()
            assert tb.write(step) == 2                                        # two layers
            means.append(coll.get_statistics('2').output_stats.mean)
    assert tb.writer is None                                                  # closed by the `with` block
    steps, vals = events(tmp_path, 'activations/2.output/mean')
    assert steps == [0, 1, 2] and vals == pytest.approx(means, rel=1e-6)
    with TensorBoardCB(tmp_path, coll) as tb2: tb2.write()                    # a new writer on the folder goes on after its last step
    assert sorted(events(tmp_path, 'activations/2.output/mean')[0]) == [0, 1, 2, 3]   # two event files: read in their names' order, which a second may tie

def test_activation_stats_from_a_plain_loop(tmp_path):
    net, astats = model(), ActivationStats(['0', '2'], every=2)
    tb = TensorBoardCB(tmp_path, astats)
    with astats.attach(net):
        for xb, yb in list(dls().train) * 2: net(xb)                          # 6 training forwards: 1st, 3rd, 5th recorded
        assert tb.write() == 2 * 3
    tb.close()
    steps, vals = events(tmp_path, 'activations/2.output/std')
    assert steps == [0, 2, 4] and vals == pytest.approx(astats.series('train')['2'].stds.tolist(), rel=1e-6)
    assert tb.next_step == 6

def test_write_without_statistics_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match='no statistics to write'): TensorBoardCB(tmp_path).write()

def test_statistics_cb_carries_parameters_and_their_gradients(tmp_path):
    "`StatisticsCB` with `collect_weights` and `collect_param_grads` (hooks that take the `.grad`, removed after fit): TensorBoard gets each parameter's scalars, equal to the collector's."
    cfg = StatisticsConfig(collect_weights=True, collect_param_grads=True, collect_input=False)
    scb = StatisticsCB(cfg, layers=['0'])
    m = model()
    learn = Learner(m, dls(), loss_func=F.cross_entropy, lr=0.1, cbs=[TrainCB(), scb, TensorBoardCB(tmp_path, astats=scb)])
    learn.fit(1)
    st = scb.stats.get_statistics('0')
    assert set(st.params) == set(st.param_grads) == {'weight', 'bias'} and st.param_grads['weight'].count == 3 * 20
    assert not m[0].weight._post_accumulate_grad_hooks and not m[0]._forward_hooks     # nothing left behind
    steps, vals = events(tmp_path, 'activations/0.param_grad[weight]/std')
    assert len(steps) == 1 and vals[0] == pytest.approx(st.param_grads['weight'].std, rel=1e-6)
    assert events(tmp_path, 'activations/0.param[bias]/mean')[1] == [pytest.approx(st.params['bias'].mean, rel=1e-6)]
