"""The course's lesson 11 (11_initializing.ipynb of fastai/course22p2), cell by cell, against the package.

Written the way the course writes it: star imports from `miniai.*`, `MomentumLearner`, `GeneralRelu`, `init_weights`,
`lsuv_init(model, m, m_in, xb)`, `LayerNorm`/`BatchNorm`, `BatchTransformCB`. Training is cut to a few batches: what is
checked is that the course's code runs and does what the lesson says, not accuracy.
"""
import inspect, itertools, math, sys
from functools import partial

import pytest
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import torch, fastcore.all as fc
from torch import nn
import torch.nn.functional as F
from torcheval.metrics import MulticlassAccuracy

# the course's imports of lesson 11, in the course's order
from miniai.datasets import *
from miniai.conv import *
from miniai.learner import *
from miniai.activations import *
from miniai.init import *
from miniai.init import block_filter, lsuv_model, variant_defaults, make_variant, variant_learner
from miniai.init import _lsuv_stats          # exported by the course's module, not by its __all__

N_TRAIN, N_VALID = 4, 2


def few(dls, n_train=N_TRAIN, n_valid=N_VALID):
    "The first batches of `dls`: training shuffles as usual, so each call draws from the global generator."
    return DataLoaders(list(itertools.islice(dls.train, n_train)), list(itertools.islice(dls.valid, n_valid)))


pytestmark = pytest.mark.usefixtures('one_thread')   # see conftest.py

@pytest.fixture(scope='module')
def dls1024(): return few(fashion_dls(1024))

@pytest.fixture(scope='module')
def xb(dls1024): return dls1024.train[0][0]

@pytest.fixture(autouse=True)
def _close_figs():
    yield
    plt.close('all')


def fit_course(model, dls, lr, cbs=(), epochs=1):
    "The course's `learn = MomentumLearner(model, dls, F.cross_entropy, lr=..., cbs=cbs); learn.fit(n)`, returning the metrics."
    metrics = MetricsCB(accuracy=MulticlassAccuracy())
    metrics._log = lambda d: None
    learn = MomentumLearner(model, dls, F.cross_entropy, lr=lr, cbs=[DeviceCB(), metrics, *cbs])
    learn.fit(epochs)
    return learn, metrics.log_hist[-1]


def test_names_the_course_imports():
    import miniai.conv, miniai.init
    for nm in ('conv', 'def_device', 'to_device', 'collate_device'): assert nm in miniai.conv.__all__, nm
    for nm in ('clean_ipython_hist', 'clean_tb', 'clean_mem', 'BatchTransformCB', 'GeneralRelu', 'plot_func', 'init_weights',
               'lsuv_init', 'conv', 'get_model', 'LayerNorm', 'BatchNorm'):
        assert nm in miniai.init.__all__, nm
    assert callable(miniai.init._lsuv_stats)
    assert list(inspect.signature(lsuv_init).parameters)[:4] == ['model', 'm', 'm_in', 'xb']
    assert callable(set_seed)


def test_conv_and_device_helpers():
    import miniai.conv as c7
    bare = c7.conv(64, 10, act=False)
    assert type(bare) is nn.Conv2d and bare.bias is not None and bare.stride == (2, 2) and bare.padding == (1, 1)
    blk = c7.conv(1, 8)
    assert [type(o) for o in blk] == [nn.Conv2d, nn.ReLU]
    xs, ys = collate_device([(torch.zeros(1, 28, 28), 3), (torch.ones(1, 28, 28), 5)])
    assert xs.shape == (2, 1, 28, 28) and ys.tolist() == [3, 5] and xs.device.type == torch.device(def_device).type
    assert to_device({'a': [torch.zeros(1)]})['a'][0].device.type == torch.device(def_device).type


def test_why_init_matters():
    "The lesson's reasoning, as it runs: fifty random 100x100 layers overflow with weights of std 1, underflow with 0.01, keep their size with 1/sqrt(n_in); with ReLUs 1/sqrt(n_in) fades and Kaiming's sqrt(2/n_in) does not."
    def through(scale, relu=False, n=50):
        x = torch.randn(200, 100)
        for _ in range(n):
            x = x @ (torch.randn(100, 100) * scale)
            if relu: x = x.relu()
        return x
    set_seed(0)
    assert not torch.isfinite(through(1.)).any()
    assert (through(0.01) == 0).all()
    assert 0.01 < through(0.1).std() < 100
    assert through(1/math.sqrt(100), relu=True).std() < 1e-5
    assert 0.01 < through(math.sqrt(2/100), relu=True).std() < 10
    # a ReLU halves the mean square; a layer adds up n_in products of mean square 1
    z = torch.randn(100_000)
    assert abs(z.relu().pow(2).mean() / z.pow(2).mean() - 0.5) < 0.02
    assert 9 < (torch.randn(1000, 100) @ torch.randn(100, 100)).std() < 11


def test_init_weights_keeps_a_deep_relu_stack_alive():
    "Eight bias-free conv+ReLU blocks: PyTorch's default init shrinks the std about 0.4 times per block, `init_weights` (Kaiming) keeps it."
    def stack(): return nn.Sequential(*[nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.ReLU()) for _ in range(8)])
    set_seed(0)
    x = torch.randn(16, 16, 12, 12)
    with torch.no_grad():
        default, kaiming = stack()(x).std(), stack().apply(init_weights)(x).std()
    assert default < 1e-2 < 0.1 < kaiming < 10, (default, kaiming)


def test_baseline_and_kaiming(dls1024):
    # lesson 10's model with lesson 7's conv (the last one without activation)
    def get_model():
        return nn.Sequential(conv(1, 8), conv(8, 16), conv(16, 32), conv(32, 64),
                             conv(64, 10, act=False), nn.Flatten()).to(def_device)
    set_seed(42)
    astats = ActivationStats(fc.risinstance(nn.ReLU))
    learn, last = fit_course(get_model(), dls1024, 0.2, [astats])
    assert len(astats.hooks) == 4 and math.isfinite(float(last["loss"]))
    astats.color_dim(); astats.plot_stats()
    # Kaiming init
    def init_weights_course(m):
        if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)): nn.init.kaiming_normal_(m.weight)
    set_seed(42); a = get_model().apply(init_weights_course)
    set_seed(42); b = get_model().apply(init_weights)
    for p, q in zip(a.parameters(), b.parameters()): assert torch.equal(p, q)


def test_input_normalisation_with_batchtransformcb(dls1024, xb):
    xmean, xstd = xb.mean(), xb.std()
    def _norm(b): return (b[0]-xmean)/xstd, b[1]
    norm = BatchTransformCB(_norm)
    seen = []
    class Peek(Callback):
        order = BatchTransformCB.order + 1
        def before_batch(self, learn): seen.append(learn.batch[0].mean().item())
    set_seed(42)
    fit_course(get_model().apply(init_weights), dls1024, 0.2, [norm, Peek()])
    assert all(abs(m) < 0.1 for m in seen), seen
    # the course's spellings of the validation switch: `on_val` by name or as the third argument, and as an attribute
    for cb in (BatchTransformCB(_norm, on_train=True, on_val=False), BatchTransformCB(_norm, True, False)):
        assert (cb.on_train, cb.on_val, cb.on_valid) == (True, False, False)
    assert BatchTransformCB(_norm).on_val is True
    # the course's Learner passes the learner to the callback
    fake = fc.NS(training=True, batch=(xb, torch.zeros(len(xb))))
    norm.before_batch(fake)
    # normalised by its own statistics: mean 0 and std 1 up to float32 rounding
    assert abs(fake.batch[0].mean().item()) < 1e-4 and abs(fake.batch[0].std().item() - 1) < 1e-4


def test_general_relu_plot_func_and_init(dls1024, xb):
    x = torch.linspace(-2, 2, 9)
    assert torch.allclose(GeneralRelu(leak=0.1, sub=0.4)(x), torch.where(x > 0, x, 0.1*x) - 0.4)
    assert torch.equal(GeneralRelu()(x), F.relu(x))
    n_figs = len(plt.get_fignums())
    assert plot_func(GeneralRelu(leak=0.1, sub=0.4)) is None      # nothing for Jupyter to show a second time
    assert len(plt.get_fignums()) == n_figs + 1 and len(plt.gca().lines) == 3
    act_gr = partial(GeneralRelu, leak=0.1, sub=0.4)
    iw = partial(init_weights, leaky=0.1)
    astats = ActivationStats(fc.risinstance(GeneralRelu))
    # the course's lesson-11 get_model: 3x3 convs throughout, the last without activation, on def_device
    model = get_model(act_gr).apply(iw)
    assert [m.kernel_size for m in model.modules() if isinstance(m, nn.Conv2d)] == [(3, 3)]*5
    assert [type(o) for o in model[-2]] == [nn.Conv2d] and next(model.parameters()).device.type == torch.device(def_device).type
    set_seed(42)
    fit_course(model, dls1024, 0.2, [astats])
    assert len(astats.hooks) == 4
    astats.dead_chart()


def test_lsuv_the_course_way(dls1024, xb):
    act_gr = partial(GeneralRelu, leak=0.1, sub=0.4)
    xb_norm = ((xb[:256] - xb.mean()) / xb.std()).to(def_device)   # the course uses its whole first batch
    model = get_model(act_gr)
    relus = [o for o in model.modules() if isinstance(o, GeneralRelu)]
    convs = [o for o in model.modules() if isinstance(o, nn.Conv2d)]
    for ms in zip(relus, convs): lsuv_init(model, *ms, xb_norm)
    with Hooks(relus, _lsuv_stats) as hooks, torch.no_grad():
        model(xb_norm)
        for h in hooks: assert abs(h.mean.item()) < 1e-3 and abs(h.std.item() - 1) < 1e-3
    set_seed(42)
    _, last = fit_course(model, dls1024, 0.2, [BatchTransformCB(lambda b: ((b[0]-xb.mean())/xb.std(), b[1]))])
    assert math.isfinite(float(last["loss"]))


def test_lsuv_wrong_calls_are_errors(xb):
    model = get_model(partial(GeneralRelu, leak=0.1, sub=0.4))
    relus = [o for o in model.modules() if isinstance(o, GeneralRelu)]
    convs = [o for o in model.modules() if isinstance(o, nn.Conv2d)]
    w0 = convs[0].weight.detach().clone()
    for call in (lambda: lsuv_init(model, xb), lambda: lsuv_init(model, xb, relus, convs),
                 lambda: lsuv_init(model, xb, acts=relus, layers=convs), lambda: lsuv_init(model, convs[0], relus[0], xb.mean())):
        with pytest.raises(TypeError, match=r'lsuv_init\(model, m, m_in, xb'): call()
    with pytest.raises(ValueError, match='not a module of `model`'): lsuv_init(model, relus[0], nn.Conv2d(1, 8, 3), xb)
    with pytest.raises(TypeError, match=r'lsuv_init\(model, m, m_in, xb\)'): lsuv_model(model, relus[0], convs[0], xb)
    assert torch.equal(convs[0].weight, w0)                      # nothing changed by the failed calls
    res = lsuv_model(model, xb)
    assert len(res) == 4 and all(abs(r['std'] - 1) < 1e-3 for r in res)


def test_layernorm_and_batchnorm(dls1024):
    act_gr = partial(GeneralRelu, leak=0.1, sub=0.4)
    iw = partial(init_weights, leaky=0.1)
    set_seed(42)
    model = get_model(act_gr, norm=LayerNorm).apply(iw)
    assert sum(isinstance(m, LayerNorm) for m in model.modules()) == 4
    _, last = fit_course(model, dls1024, 0.2)
    assert math.isfinite(float(last["loss"]))
    model = get_model(act_gr, norm=BatchNorm).apply(iw)
    set_seed(42)
    learn, last = fit_course(model, dls1024, 0.4)
    assert math.isfinite(float(last["loss"]))
    bn = model[0][1]
    assert isinstance(bn, BatchNorm) and not torch.equal(bn.means, torch.zeros_like(bn.means))
    assert model[0][0].bias is not None                          # the course's conv keeps its bias before a norm


def test_batchnorm_model_trains_in_two_fits():
    dls = few(fashion_dls(256), 6, 2)
    act_gr = partial(GeneralRelu, leak=0.1, sub=0.4)
    set_seed(42)
    model = get_model(act_gr, norm=nn.BatchNorm2d).apply(partial(init_weights, leaky=0.1))
    _, first = fit_course(model, dls, 0.2)
    _, second = fit_course(model, dls, 0.05, epochs=2)
    assert math.isfinite(float(second["loss"]))


def test_clean_mem_outside_ipython():
    try: 1/0
    except ZeroDivisionError: sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
    clean_ipython_hist(); clean_tb(); clean_mem()
    assert not hasattr(sys, 'last_traceback')


def test_batchnorm_variant_recipe():
    d = variant_defaults('batchnorm')
    assert {'lr', 'bs', 'epochs', 'opt_func'} <= set(d) and d['epochs'] == 3
    dls = few(fashion_dls(d['bs']), 2, 1)
    v = make_variant('batchnorm', dls)
    assert v['bs'] == d['bs'] and v['lr'] == d['lr']
    assert v['layers'] is block_filter and 'mod_filter' not in v
    astats = ActivationStats(v['layers'])
    learn = variant_learner(v, dls, [astats])
    learn.fit(1)
    assert len(astats.hooks) == 5
