"""One meaning of `every` (the 1st, (N+1)th... training batch) and of `check_every`, for the collector and StatisticsCB; StatisticsCB
records through the collector's own hook, and merges itself across ranks with `all_reduce`."""
import types, warnings, math
import pytest, torch, torch.nn.functional as F
from torch import nn
from miniai.learner import Learner, TrainCB
from miniai.statistics import StatisticsConfig, ActivationStatisticsHook
from miniai.monitoring import StatisticsCB

def test_collector_every_counts_training_calls_and_records_every_eval_call():
    net = nn.Sequential(nn.Linear(4, 3))
    hook = ActivationStatisticsHook(StatisticsConfig(every=3, collect_input=False))
    with hook.attach(net):
        for _ in range(7): net(torch.randn(2, 4))          # training calls 1..7: 1, 4, 7 recorded
        net.eval()
        for _ in range(2): net(torch.randn(5, 4))          # evaluation calls: all recorded, not counted by `every`
        net.train()
        for _ in range(3): net(torch.randn(2, 4))          # training calls 8, 9, 10: 10 recorded
    st = hook.get_statistics('0')
    assert (st.calls, st.n_updates, st.total_samples) == (12, 6, 4*2 + 2*5)

def test_state_keeps_the_training_count():
    hook = ActivationStatisticsHook(StatisticsConfig(every=2))
    for _ in range(3): hook.update_statistics('m', None, torch.randn(4))
    resumed = ActivationStatisticsHook(StatisticsConfig(every=2)).load_state_dict(hook.state_dict())
    for c in (hook, resumed): c.update_statistics('m', None, torch.randn(4)); c.update_statistics('m', None, torch.randn(4))
    assert hook.get_statistics('m').n_updates == resumed.get_statistics('m').n_updates == 3     # calls 1, 3, 5
    old = hook.state_dict(); old['modules'] = {k: {kk: v for kk, v in m.items() if kk != 'train_calls'} for k, m in old['modules'].items()}
    assert ActivationStatisticsHook(StatisticsConfig(every=2)).load_state_dict(old).get_statistics('m').calls == 5   # a state saved before

def _fit(cb, n=7, epochs=1):
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    data = [(torch.randn(5, 4), torch.randn(5, 3)) for _ in range(n)]
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        Learner(model, types.SimpleNamespace(train=data, valid=data[:2]), F.mse_loss, lr=0., cbs=[TrainCB(), cb]).fit(epochs)
    return cb

@pytest.mark.parametrize('kw', [dict(every=3), dict(config=StatisticsConfig(every=3, collect_input=False)), dict(update_frequency=3),
                                dict(every=3, config=StatisticsConfig(every=3))])
def test_statistics_cb_every_is_one_count_of_training_batches(kw):
    cb = _fit(StatisticsCB(layers=['0'], **kw))
    st = cb.stats.get_statistics('0')
    assert (cb.every, st.calls, st.n_updates) == (3, 3, 3)          # batches 1, 4, 7: not 3 x 3
    assert cb.stats.config.every == 1                                # the callback picks the batches, the collector records them

def test_statistics_cb_refuses_two_everys():
    with pytest.raises(ValueError, match=r'`every` \(2\) and `config.every` \(3\) disagree'):
        StatisticsCB(config=StatisticsConfig(every=3), every=2)

def test_check_every_counts_from_the_first_training_batch():
    cb = StatisticsCB(layers=['1'], check_every=3, vanishing_std=5., exploding_std=None)   # every check finds the layer vanishing
    _fit(cb, n=7, epochs=2)
    # training batches 1, 4, 7 (iters 0, 3, 6 of the first epoch), 10 and 13 (iters 2 and 5 of the second), and each epoch's end
    assert sorted({(a['epoch'], a['iter']) for a in cb.alerts}) == [(0, 0), (0, 3), (0, 6), (1, 2), (1, 5), (1, 6)]

def test_statistics_cb_records_through_the_collector_hook():
    "The callback's hook function is the collector's own `hook`: calls and names counted once, in one place."
    cb = StatisticsCB(layers=['0', '1'])
    assert cb.hookfunc == cb.stats.hook
    _fit(cb, n=4)
    assert cb.stats.call_count == 2 * 4 and list(cb.stats.get_all_statistics()) == ['0', '1']

def test_statistics_cb_all_reduce_needs_a_process_group():
    with pytest.raises(RuntimeError, match='process group'): StatisticsCB().all_reduce()

def test_collector_every_counts_the_attached_models_training_forwards_as_activation_stats_does():
    "A module the forward calls twice: with every=2 the collector under `attach` records both calls of batches 1, 3, 5, the very calls ActivationStats records with the same `every`, with the same numbers."
    from miniai.activations import ActivationStats
    class Twice(nn.Module):
        def __init__(self): super().__init__(); torch.manual_seed(0); self.lin, self.out = nn.Linear(4, 4), nn.Linear(4, 2)
        def forward(self, x): return self.out(self.lin(torch.relu(self.lin(x))))
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(5, 4, generator=g) for _ in range(6)]
    model = Twice()
    coll = ActivationStatisticsHook(StatisticsConfig(every=2, collect_input=False, collect_percentiles=[]))
    astats = ActivationStats(layers=['lin', 'out'], every=2)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')                                  # the CalledTwiceWarning of `lin`
        with coll.attach(model, layers=['lin', 'out']), astats.attach(model):
            for x in xs: model(x)
    lin, out = coll.get_statistics('lin'), coll.get_statistics('out')
    assert (lin.calls, lin.n_updates, out.calls, out.n_updates) == (12, 6, 6, 3)
    assert astats.calls == {'lin': 6, 'out': 3}                          # the same batches: 1, 3, 5, each call of them
    for name, st in (('lin', lin), ('out', out)):
        rec = astats.recorders['train'][name]['output']
        assert st.output_stats.count == int(rec.moments.count.sum())
        assert math.isclose(st.output_stats.mean, float((rec.moments.mean * rec.moments.count).sum() / rec.moments.count.sum()), rel_tol=1e-9)
    with coll.attach(model, layers=['lin']):                             # the count goes on across blocks: batches 7, 8
        model(xs[0]); model(xs[1])
    assert coll.get_statistics('lin').n_updates == 8                     # batch 7 recorded (twice), not 8
    back = ActivationStatisticsHook(StatisticsConfig(every=2, collect_input=False, collect_percentiles=[])).load_state_dict(coll.state_dict())
    with back.attach(model, layers=['lin']): model(xs[2])               # batch 9 of the resumed collector
    assert back.get_statistics('lin').n_updates == 10
