"""The course's lesson 10 (10_activations.ipynb of fastai/course22p2), cell by cell, against the package.

Written the way the course writes it: star imports from `miniai.*`, the course's `fit(model, xtra_cbs=...)` with
`TrainCB`, `DeviceCB`, `MetricsCB`, `ProgressCB`, its `SequentialModel`, raw hooks, `Hook`, `Hooks`, `append_stats`,
`HooksCallback`, `get_hist`, `get_min` and `ActivationStats`, and callbacks in both of the course's styles: the final
notebooks' `before_fit(self, learn)` and the lesson videos' `before_fit(self)` reading `self.model`. Training is cut to a
few real FashionMNIST batches: what is checked is that the course's code runs and does what the lesson says, not accuracy.
"""
import inspect, itertools, copy, pickle
from functools import partial
from operator import attrgetter

import pytest
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import torch, fastcore.all as fc
from torch import nn
import torch.nn.functional as F
from torcheval.metrics import MulticlassAccuracy

# the course's imports of lesson 10
from miniai.datasets import *
from miniai.learner import *
from miniai.activations import *
from miniai.findings import THRESHOLDS

N_TRAIN, N_VALID = 3, 1


pytestmark = pytest.mark.usefixtures('one_thread')   # see conftest.py


@pytest.fixture(autouse=True)
def _close_figs():
    yield
    plt.close('all')


@pytest.fixture(scope='module')
def dls():
    "The course's `dls` (bs 1024), cut to its first batches."
    full = fashion_dls(1024)
    return DataLoaders(list(itertools.islice(full.train, N_TRAIN)), list(itertools.islice(full.valid, N_VALID)))


# the course's lesson-10 `conv` and `cnn_layers`
def conv(ni, nf, ks=3, act=True):
    res = nn.Conv2d(ni, nf, stride=2, kernel_size=ks, padding=ks//2)
    if act: res = nn.Sequential(res, nn.ReLU())
    return res

def cnn_layers():
    return [
        conv(1 ,8, ks=5),        #14x14
        conv(8 ,16),             #7x7
        conv(16,32),             #4x4
        conv(32,64),             #2x2
        conv(64,10, act=False),  #1x1
        nn.Flatten()]


@pytest.fixture
def fit(dls):
    "The course's `cbs` and `fit`."
    metrics = MetricsCB(accuracy=MulticlassAccuracy())
    cbs = [TrainCB(), DeviceCB(), metrics, ProgressCB(plot=True)]
    def fit(model, epochs=1, xtra_cbs=None):
        learn = Learner(model, dls, loss_func=F.cross_entropy, lr=0.6, cbs=cbs+fc.L(xtra_cbs))
        learn.fit(epochs)
        return learn
    fit.metrics = metrics
    return fit


def test_baseline_and_sequential_model(fit):
    set_seed(1)
    learn = fit(nn.Sequential(*cnn_layers()))                     # the baseline
    assert [d['train'] for d in fit.metrics.log_hist] == ['train', 'eval']
    # statistics recorded by the model itself
    class SequentialModel(nn.Module):
        def __init__(self, *layers):
            super().__init__()
            self.layers = nn.ModuleList(layers)
            self.act_means = [[] for _ in layers]
            self.act_stds  = [[] for _ in layers]

        def __call__(self, x):
            for i,l in enumerate(self.layers):
                x = l(x)
                self.act_means[i].append(to_cpu(x).mean())
                self.act_stds [i].append(to_cpu(x).std ())
            return x

        def __iter__(self): return iter(self.layers)
    set_seed(1)
    model = SequentialModel(*cnn_layers())
    learn = fit(model)
    assert [len(l) for l in model.act_means] == [N_TRAIN + N_VALID]*6
    for l in model.act_means: plt.plot(l)
    plt.legend(range(5));


def test_pytorch_hooks_and_hook_class(fit):
    # raw PyTorch hooks
    set_seed(1)
    model = nn.Sequential(*cnn_layers())
    act_means = [[] for _ in model]
    act_stds  = [[] for _ in model]
    def append_stats(i, mod, inp, outp):
        act_means[i].append(to_cpu(outp).mean())
        act_stds [i].append(to_cpu(outp).std())
    for i,m in enumerate(model): m.register_forward_hook(partial(append_stats, i))
    fit(model)
    assert [len(o) for o in act_means] == [N_TRAIN + N_VALID]*6
    # the Hook class with the course's two-list append_stats
    def append_stats(hook, mod, inp, outp):
        if not hasattr(hook,'stats'): hook.stats = ([],[])
        acts = to_cpu(outp)
        hook.stats[0].append(acts.mean())
        hook.stats[1].append(acts.std())
    set_seed(1)
    model = nn.Sequential(*cnn_layers())
    hooks = [Hook(l, append_stats) for l in model[:5].children()]
    learn = fit(model)
    for h in hooks:
        plt.plot(h.stats[0])
        h.remove()
    plt.legend(range(5));
    assert [len(h.stats[0]) for h in hooks] == [N_TRAIN + N_VALID]*5
    assert all(not m._forward_hooks for m in model[:5])
    # Hooks as a context manager, on every child (Flatten included)
    set_seed(1)
    model = nn.Sequential(*cnn_layers())
    with Hooks(model, append_stats) as hooks:
        fit(model)
        fig,axs = plt.subplots(1,2, figsize=(10,4))
        for h in hooks:
            for i in 0,1: axs[i].plot(h.stats[i])
        plt.legend(range(6));
    assert len(hooks) == 6 and all(not m._forward_hooks for m in model)
    hooks = Hooks(model, append_stats)
    del hooks[0]
    assert len(hooks) == 5 and not model[0]._forward_hooks
    hooks.remove()


def course_append_stats(hook, mod, inp, outp):
    "The course's append_stats with its histogram."
    if not hasattr(hook,'stats'): hook.stats = ([],[],[])
    acts = to_cpu(outp)
    hook.stats[0].append(acts.mean())
    hook.stats[1].append(acts.std())
    hook.stats[2].append(acts.abs().histc(40,0,10))


class CourseHooksCallback(Callback):
    "The course's final HooksCallback, whose methods take the learner."
    def __init__(self, hookfunc, mod_filter=fc.noop, on_train=True, on_valid=False, mods=None):
        fc.store_attr()
        super().__init__()

    def before_fit(self, learn):
        if self.mods: mods=self.mods
        else: mods = fc.filter_ex(learn.model.modules(), self.mod_filter)
        self.hooks = Hooks(mods, partial(self._hookfunc, learn))

    def _hookfunc(self, learn, *args, **kwargs):
        if (self.on_train and learn.training) or (self.on_valid and not learn.training): self.hookfunc(*args, **kwargs)

    def after_fit(self, learn): self.hooks.remove()
    def __iter__(self): return iter(self.hooks)
    def __len__(self): return len(self.hooks)


class VideoHooksCallback(Callback):
    "The lesson video's HooksCallback: no `learn` argument, the learner's attributes read as `self.model`, `self.training`."
    def __init__(self, hookfunc, mod_filter=fc.noop):
        fc.store_attr()
        super().__init__()

    def before_fit(self):
        mods = fc.filter_ex(self.model.modules(), self.mod_filter)
        self.hooks = Hooks(mods, self._hookfunc)

    def _hookfunc(self, *args, **kwargs):
        if self.training: self.hookfunc(*args, **kwargs)

    def after_fit(self): self.hooks.remove()
    def __iter__(self): return iter(self.hooks)
    def __len__(self): return len(self.hooks)


def test_hooks_callbacks_in_both_styles_in_one_fit(fit):
    course_hc = CourseHooksCallback(course_append_stats, mod_filter=fc.risinstance(nn.Conv2d))
    video_hc = VideoHooksCallback(course_append_stats, mod_filter=fc.risinstance(nn.Conv2d))
    package_hc = HooksCallback(course_append_stats, mod_filter=fc.risinstance(nn.Conv2d))
    assert not hasattr(video_hc, 'model') and not hasattr(video_hc, 'stats')   # no learner yet: no recursion, a plain AttributeError
    set_seed(1)
    model = nn.Sequential(*cnn_layers())
    fit(model, xtra_cbs=[course_hc, video_hc, package_hc]);
    for hc in (course_hc, video_hc, package_hc):
        assert len(hc) == 5 and len(hc.hooks) == 5
        assert [len(h.stats[0]) for h in hc] == [N_TRAIN]*5                  # training batches only
    for a, b, c in zip(course_hc, video_hc, package_hc):                      # the same activations, seen three ways
        for i in range(3): assert torch.equal(torch.stack(a.stats[i]), torch.stack(b.stats[i])) and torch.equal(torch.stack(a.stats[i]), torch.stack(c.stats[i]))
    assert all(not m._forward_hooks for m in model.modules())
    # the course's plots from the callback's hooks
    fig,axs = plt.subplots(1,2, figsize=(10,4))
    for h in package_hc:
        for i in 0,1: axs[i].plot(h.stats[i])
    plt.legend(range(6));
    fig,axes = get_grid(len(package_hc), figsize=(11,5))
    for ax,h in zip(axes.flat, package_hc):
        show_image(get_hist(h), ax, origin='lower')
    fig,axes = get_grid(len(package_hc), figsize=(11,5))
    for ax,h in zip(axes.flatten(), package_hc):
        ax.plot(get_min(h))
        ax.set_ylim(0,1)
    h = package_hc.hooks[0]
    assert get_hist(h).shape == (40, N_TRAIN) and ((get_min(h) >= 0) & (get_min(h) <= 1)).all()


def test_callbacks_of_each_style_share_one_fit(fit):
    "A course-style and a video-style callback beside miniai's own, on the same batches."
    class CourseCB(Callback):
        def before_fit(self, learn): self.losses, self.learner = [], learn
        def after_batch(self, learn):
            if learn.training: self.losses.append(learn.loss.item())
    class VideoCB(Callback):
        def before_fit(self): self.losses = []
        def after_batch(self):
            if self.training: self.losses.append(self.loss.item())
            assert self.batch is self.learn.batch and self.preds is self.learn.preds and self.iter == self.learn.iter
    class MixedCB(Callback):
        def before_fit(self, learn=None): self.n = 0
        def after_batch(self): self.n += 1
    course_cb, video_cb, mixed_cb = CourseCB(), VideoCB(), MixedCB()
    set_seed(1)
    learn = fit(nn.Sequential(*cnn_layers()), xtra_cbs=[course_cb, video_cb, mixed_cb])
    assert course_cb.learner is learn and video_cb.learn is learn
    assert course_cb.losses == video_cb.losses and len(video_cb.losses) == N_TRAIN
    assert mixed_cb.n == N_TRAIN + N_VALID
    assert video_cb.epoch == 0 and video_cb.model is learn.model and video_cb.opt is learn.opt and video_cb.dls is learn.dls


def test_activation_stats_as_in_the_course(fit):
    # the course's ActivationStats and its three plots
    astats = ActivationStats(fc.risinstance(nn.Conv2d))
    set_seed(1)
    model = nn.Sequential(*cnn_layers())
    fit(model, xtra_cbs=[astats]);
    assert len(astats) == 5 and len(astats.hooks) == 5 and len(list(astats)) == 5
    assert [len(h.stats[0]) for h in astats] == [N_TRAIN]*5
    assert get_hist(astats.hooks[0]).shape == (41, N_TRAIN)            # 40 bins and the overflow
    for name in ('color_dim', 'dead_chart', 'plot_stats'):
        n_figs = len(plt.get_fignums())
        res = getattr(astats, name)()
        assert res is None, f'{name} returned {res!r}: Jupyter would show the figure a second time'
        assert len(plt.get_fignums()) == n_figs + 1 and plt.gcf() is astats.fig
    assert all(not m._forward_hooks for m in model.modules())


class CourseLearner():
    "The course's final `Learner` (miniai/learner.py of course22p2): callbacks get the learner as an argument, `cb.learn` is never set."
    def __init__(self, model, dls=(0,), loss_func=F.mse_loss, lr=0.1, cbs=None, opt_func=torch.optim.SGD):
        cbs = fc.L(cbs)
        fc.store_attr()

    def _run_cbs(self, method_nm):
        for cb in sorted(self.cbs, key=attrgetter('order')):
            method = getattr(cb, method_nm, None)
            if method is not None: method(self)

    def _with(self, nm, f, exc):
        try:
            self._run_cbs(f'before_{nm}')
            f()
            self._run_cbs(f'after_{nm}')
        except exc: pass
        finally: self._run_cbs(f'cleanup_{nm}')

    def _one_batch(self):
        for step in ('predict', 'get_loss'): self._run_cbs(step)
        if self.training:
            for step in ('backward', 'step', 'zero_grad'): self._run_cbs(step)

    def _one_epoch(self):
        for self.iter,self.batch in enumerate(self.dl): self._with('batch', self._one_batch, CancelBatchException)

    def one_epoch(self, training):
        self.model.train(training)
        self.dl = self.dls.train if training else self.dls.valid
        self._with('epoch', self._one_epoch, CancelEpochException)

    def _fit(self):
        for self.epoch in self.epochs:
            self.one_epoch(True)
            with torch.no_grad(): self.one_epoch(False)

    def fit(self, n_epochs=1):
        self.n_epochs, self.epochs = n_epochs, range(n_epochs)
        self.opt = self.opt_func(self.model.parameters(), self.lr)
        self._with('fit', self._fit, CancelFitException)

    @property
    def training(self): return self.model.training


def test_miniai_callbacks_run_in_the_courses_learner(dls):
    "miniai's callbacks take the learner as their argument, so the course's own `Learner` runs them."
    metrics = MetricsCB(accuracy=MulticlassAccuracy())
    astats = ActivationStats(fc.risinstance(nn.Conv2d))
    cbs = [TrainCB(), DeviceCB(), metrics, ProgressCB(plot=True), astats]
    set_seed(1)
    model = nn.Sequential(*cnn_layers())
    learn = CourseLearner(model, dls, F.cross_entropy, lr=0.6, cbs=cbs)
    learn.fit(1)
    assert all(cb.learn is None for cb in cbs)                           # nothing ever set `cb.learn`
    assert [d['train'] for d in metrics.log_hist] == ['train', 'eval']
    assert [len(h.stats[0]) for h in astats] == [N_TRAIN]*5
    assert all(not m._forward_hooks for m in model.modules())
    astats.plot_stats()


def test_signatures_read_once_not_per_batch(dls, monkeypatch):
    "`run_cbs` reads a method's signature once per class and method: a second fit reads none."
    from miniai.kernel import batch_moments, Recorder, fused_kernel
    with fused_kernel(True): batch_moments(torch.ones(10)); Recorder().record(torch.ones(10))   # the CPU loops ready first (it waits for them): numba reads many signatures when it compiles or loads them
    calls = []
    real = inspect.signature
    monkeypatch.setattr(inspect, 'signature', lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    class Tally(Callback):
        def after_batch(self, learn): self.n = getattr(self, 'n', 0) + 1
    cbs = [TrainCB(), Tally(), ActivationStats(fc.risinstance(nn.Conv2d))]
    learn = Learner(nn.Sequential(*cnn_layers()), dls, F.cross_entropy, lr=0.1, cbs=cbs)
    learn.fit(1)
    first = len(calls)
    assert 0 < first <= 20, first
    learn.fit(2)
    assert len(calls) == first and cbs[1].n == 3*(N_TRAIN + N_VALID)


def test_forwarding_is_safe():
    "The video style's forwarded attributes: no recursion without a learner, copies and pickles work, own attributes win."
    cb = TrainCB()
    with pytest.raises(AttributeError, match='no learner yet'): cb.model
    assert not hasattr(cb, 'stats') and not hasattr(cb, 'anything')
    assert pickle.loads(pickle.dumps(cb)).n_inp == 1 and copy.deepcopy(cb).n_inp == 1
    metrics = MetricsCB()
    assert metrics.loss is metrics.all_metrics['loss']                   # its own `loss`, not the learner's
    cb.learn = fc.NS(model='m', training=False)
    assert cb.model == 'm' and cb.training is False
    with pytest.raises(AttributeError): cb.preds


def test_lr_find_returns_nothing(dls):
    set_seed(1)
    learn = MomentumLearner(nn.Sequential(*cnn_layers()), dls, F.cross_entropy, cbs=[DeviceCB()])
    assert learn.lr_find(max_epochs=1) is None                          # no repr under the plot
    assert len(learn.lr_finder.lrs) == N_TRAIN


def test_activation_stats_layers_aliases_every_and_findings(fit):
    "`layers` and its aliases pick the same convolutions; `every` records every N-th batch; `diagnose` rows carry findings."
    picked = []
    for kw in (dict(layers=nn.Conv2d), dict(mod_filter=fc.risinstance(nn.Conv2d)), dict(mods='Conv2d'), dict(layers=['0.0', '4'])):
        set_seed(1)
        astats = ActivationStats(every=2, **kw)
        fit(nn.Sequential(*cnn_layers()), xtra_cbs=[astats])
        picked.append([h.name for h in astats])
        assert [len(h.stats[0]) for h in astats] == [2] * len(astats)          # batches 0 and 2 of the three
        # lesson 10's absolute limits (`relative=False`): every layer is "dead" (its lowest |x| bin) at this threshold
        rows = astats.diagnose(thresholds=THRESHOLDS.but(dead=0.), relative=False)
        for r in rows:
            assert {'layer', 'mean', 'std', 'dead', 'overflow', 'nonfinite', 'flags', 'findings'} <= set(r)
            dead = [f for f in r['findings'] if f['issue'] == 'dead']
            assert dead == [dict(layer=r['layer'], issue='dead', value=r['dead'], threshold=0., measure='dead')]
            assert r['flags'] == list(dict.fromkeys(f['issue'] for f in r['findings']))
        assert all('dead' in line for line in format_diagnosis(rows).split('\n')[1:len(rows)+1])   # the table shows the rows' flags
        # the verdict counts exact zeros for "dead": no conv output here is exactly 0, so the same threshold flags none
        verdict = astats.diagnose(thresholds=THRESHOLDS.but(dead=0.))
        assert [r['layer'] for r in verdict] == [r['layer'] for r in rows] and all(r['zeros'] == 0 for r in verdict)
        assert not any(f['issue'] == 'dead' for r in verdict for f in r['findings']), format_diagnosis(verdict)
        assert all(r['flags'] == list(dict.fromkeys(f['issue'] for f in r['findings'] if f.get('downstream') is None)) for r in verdict)
    assert picked[0] == picked[1] == picked[2] == ['0.0', '1.0', '2.0', '3.0', '4'] and picked[3] == ['0.0', '4']
    with pytest.raises(KeyError, match=r"layers: '0.O' is neither a layer name nor a class name in the model; closest layer names: .*'0.0'"):
        fit(nn.Sequential(*cnn_layers()), xtra_cbs=[ActivationStats(layers='0.O')])
