"""`ActivationStats`' public interface for other modules and practitioners: training and validation kept apart (`on_valid`),
`series(phase)`, `all_reduce`, plain `bins`/`hi`/`every` attributes, and `hook` as the one override point of a recording callback."""
import warnings
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import pytest, torch
from torch import nn
import torch.nn.functional as F

from miniai.hooks import HooksCallback, Hook
from miniai.activations import ActivationStats, get_hist, get_min, main_recorder
from miniai.kernel import Recorder


@pytest.fixture(autouse=True)
def _close_figs():
    yield
    plt.close('all')


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def train_and_eval(cb, model, n_train=3, n_valid=2, scale_valid=100.):
    "`n_train` training steps, then `n_valid` evaluation forwards on inputs `scale_valid` times larger, under `attach`."
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with cb.attach(model):
        for _ in range(n_train):
            F.cross_entropy(model(torch.randn(16, 6)), torch.randint(0, 3, (16,))).backward(); opt.step(); opt.zero_grad()
        model.eval()
        with torch.no_grad():
            for _ in range(n_valid): model(torch.randn(16, 6) * scale_valid)
        model.train()
    return cb


def test_validation_batches_get_series_of_their_own():
    a = train_and_eval(ActivationStats(on_valid=True), mlp())
    train, valid = a.series(), a.series('valid')
    assert list(train) == list(valid) == ['0', '2'] == a.names
    assert [len(r) for r in train.values()] == [3, 3] and [len(r) for r in valid.values()] == [2, 2]
    assert all(t is not v for t, v in zip(train.values(), valid.values()))
    # the validation inputs are 100 times larger: their stds are, and none of it leaks into the training series
    assert (valid['0'].stds.min() > 20 * train['0'].stds.max())
    assert [len(h.stats[0]) for h in a] == [3, 3]                      # the course's triple reads training batches
    assert a.series('train') == a.series()                             # training is the default
    rows = {p: a.diagnose(phase=p) for p in ('train', 'valid')}
    assert rows['valid'][0]['std'] > 20 * rows['train'][0]['std']
    for plot in ('color_dim', 'dead_chart', 'plot_stats'):
        getattr(a, plot)(phase='valid'); lines = a.fig.axes[0].get_lines()
        if plot == 'dead_chart': assert len(lines[0].get_ydata()) == 2
    a.color_dim()
    assert a.fig.axes[0].get_images()[0].get_array().shape == (41, 3)   # training: 3 batches


def test_without_on_valid_no_validation_series():
    a = train_and_eval(ActivationStats(), mlp())
    assert a.series('valid') == {} and [len(r) for r in a.series().values()] == [3, 3]
    with pytest.raises(ValueError, match="no hooked layer recorded valid statistics to plot: 0 \\(nothing recorded\\)"): a.color_dim(phase='valid')
    with pytest.raises(ValueError, match="series: `phase` is 'train' or 'valid', got 'eval'"): a.series('eval')


def test_on_valid_only_records_no_training_batch():
    a = train_and_eval(ActivationStats(on_train=False, on_valid=True), mlp())
    assert a.series() == {} and [len(r) for r in a.series('valid').values()] == [2, 2]


def test_every_counts_training_batches_from_the_first():
    "`every=2` records training batches 1, 3, 5 (counted from 1); validation forwards are not counted and all recorded."
    a = train_and_eval(ActivationStats(every=2, on_valid=True), mlp(), n_train=5, n_valid=3)
    assert [len(r) for r in a.series().values()] == [3, 3] and [len(r) for r in a.series('valid').values()] == [3, 3]


def test_plain_settings_and_no_rec_kwargs():
    a = ActivationStats(bins=20, hi=5., every=3)
    assert (a.bins, a.hi, a.every, a.sample, a.exact, a.grads) == (20, 5., 3, 16384, False, False)
    assert not hasattr(a, 'rec_kwargs')
    train_and_eval(a, mlp(), n_train=4)
    rec = a.series()['0']
    assert (rec.bins, rec.hi, len(rec)) == (20, 5., 2) and rec.hists.shape == (2, 21)


def test_all_reduce_outside_distributed_changes_nothing():
    a = train_and_eval(ActivationStats(on_valid=True, output_grads=True), mlp())
    before = {n: r.means.clone() for n, r in a.series().items()}
    assert a.all_reduce() == 0
    assert all(torch.equal(before[n], r.means) for n, r in a.series().items())


def test_gradients_kept_by_phase_and_layer():
    a = train_and_eval(ActivationStats(output_grads=True, on_valid=True), mlp())
    recs = a.recorders
    assert [len(recs['train'][n]['output_grad']) for n in a.names] == [3, 3]
    assert all('output_grad' not in recs['valid'][n] for n in a.names)      # no backward in evaluation
    assert a.hooks[0].recorders is recs['train']['0']                    # the hook's view is the callback's state


def test_hook_is_the_one_override_point():
    "A recording callback overrides `hook`; `HooksCallback` gates the phases and `every` around it, as for `hookfunc`."
    class Shapes(HooksCallback):
        def __init__(self, **kw): super().__init__(**kw); self.seen = []
        def hook(self, hook, mod, inp, outp): self.seen.append((hook.name, mod.training, tuple(outp.shape)))
    cb = train_and_eval(Shapes(layers=nn.Linear, every=2, on_valid=True), mlp(), n_train=3, n_valid=1)
    assert cb.seen == [('0', True, (16, 8)), ('2', True, (16, 3))] * 2 + [('0', False, (16, 8)), ('2', False, (16, 3))]
    assert cb.calls == {'0': 3, '2': 3}
    with pytest.raises(TypeError): HooksCallback(lambda *a: None, recompute=lambda *a: None)   # gone: override `recompute`


def test_hook_state_is_not_on_the_hooks():
    "No configuration or counters travel as attributes set on the `Hook` objects."
    a = train_and_eval(ActivationStats(output_grads=True), mlp())
    for h in a.hooks:
        assert set(vars(h)) <= {'hook', 'name', 'on_recompute', '_owner'}, vars(h)


def test_course_adapter_off_the_path():
    "`append_stats` keeps the course's `h.stats` on a plain Hook; ActivationStats' hooks show the same triple, read from the callback."
    lin = nn.Linear(4, 3)
    from miniai.activations import append_stats
    with Hook(lin, append_stats) as h:
        for _ in range(2): lin(torch.randn(8, 4))
    assert len(h.stats[0]) == 2 and isinstance(h.stats[2], list) and get_hist(h).shape == (41, 2)
    assert main_recorder(h) is h.stats.rec and get_min(h).shape == (2,)
    a = train_and_eval(ActivationStats(), mlp())
    h = a.hooks[0]
    assert main_recorder(h) is a.series()['0'] and torch.equal(h.stats[0], a.series()['0'].means)
    assert torch.equal(get_hist(h), a.series()['0'].hists.t().float().log1p())


@pytest.mark.parametrize('sample', [8, -5, 'x', 2.5, True])
def test_a_sample_the_kernel_cannot_draw_is_refused_when_made(sample):
    "Below one run of 16 values (8 divided by zero in the first forward), negative, not an integer: refused by ActivationStats itself, naming the argument."
    with pytest.raises((TypeError, ValueError), match=r"ActivationStats: `sample` must be an integer >= 16"): ActivationStats(sample=sample)

@pytest.mark.parametrize('sample', [16, 0, None])
def test_a_sample_of_16_or_none_records(sample):
    m = nn.Sequential(nn.Linear(4, 4)).train()
    astats = ActivationStats(sample=sample)
    with astats.attach(m): m(torch.randn(5000, 4))
    assert int(astats.series()['0'].hists.sum()) == 20000      # every value counted once in the histogram


def test_a_new_recording_names_the_unread_batches_it_drops():
    "A second `attach` (or fit) starts a new recording, as the course's callbacks do; batches never read are named in a warning, not dropped silently."
    model, a = mlp(), ActivationStats()
    def run(n):
        with a.attach(model):
            for _ in range(n): model(torch.randn(5, 6)).sum().backward()
    run(3)
    with pytest.warns(UserWarning, match='the 3 batches the previous one recorded were never read'): run(2)
    assert [len(r) for r in a.series().values()] == [2, 2]
    a.color_dim()                                        # read: nothing unread is dropped next time
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        run(1)
    assert [len(r) for r in a.series().values()] == [1, 1]
    assert Recorder().unread == 0
