"""Course-style cells of lessons 13 and 14 against the package, `attach` in a plain loop, ActivationStats' argument errors, torch.compile."""
import math
from functools import partial
import pytest, matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import torch, fastcore.all as fc
from torch import nn, optim
import torch.nn.functional as F
from torch.optim import lr_scheduler

from miniai.datasets import *
from miniai.conv import *
from miniai.learner import *
from miniai.activations import *
from miniai.init import *
from miniai.sgd import *
from miniai.resnet import *
from miniai.augment import *

def synth(n=4, bs=32):
    g = torch.Generator().manual_seed(0)
    b = [(torch.randn(bs, 1, 28, 28, generator=g), torch.randint(0, 10, (bs,), generator=g)) for _ in range(n)]
    return DataLoaders(b, b[:2])

def get_model(act=nn.ReLU, nfs=(8,16,32), norm=nn.BatchNorm2d):
    layers = [ResBlock(1, 8, stride=1, act=act, norm=norm)]
    layers += [ResBlock(nfs[i], nfs[i+1], act=act, norm=norm, stride=2) for i in range(len(nfs)-1)]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(nfs[-1], 10, bias=False), nn.BatchNorm1d(10))

def test_resnet_trains_with_one_cycle_and_recorder():
    dls, epochs, lr = synth(), 2, 2e-2
    tmax = epochs * len(dls.train)
    sched = partial(lr_scheduler.OneCycleLR, max_lr=lr, total_steps=tmax)
    rec = RecorderCB(lr=lambda cb: cb.pg['lr'])
    astats = ActivationStats(fc.risinstance(GeneralRelu))
    learn = TrainLearner(get_model(act_gr).apply(partial(init_weights, leaky=0.1)), dls, F.cross_entropy, lr=lr,
                         cbs=[DeviceCB(), astats, BatchSchedCB(sched), rec], opt_func=optim.AdamW)
    learn.fit(epochs)
    lrs = rec.recs['lr']
    assert len(lrs) == tmax and max(lrs) > lrs[0] and lrs[-1] < lrs[0]
    rec.plot(); astats.color_dim(); plt.close('all')
    assert len(astats.hooks[0].stats[0]) == tmax

def test_summary_capture_preds_and_erasing(capsys):
    learn = TrainLearner(get_model(), synth(), F.cross_entropy, cbs=[DeviceCB()])
    s = learn.summary()
    out = capsys.readouterr().out
    assert 'Tot params' in out and '|Module|Input|Output|Num params|MFLOPS (est.)|' in out
    assert s.rows[0]['module'] == 'ResBlock' and s.rows[0]['input'] == (32, 1, 28, 28)
    assert s.total_params == sum(p.numel() for p in learn.model.parameters())
    preds, targs, inps = learn.capture_preds(inps=True)
    assert preds.shape == (64, 10) and targs.shape == (64,) and inps.shape == (64, 1, 28, 28)
    x = torch.randn(4, 1, 28, 28)
    assert rand_erase(x.clone(), max_num=0).equal(x) and RandCopy()(x.clone()).shape == x.shape and RandErase()(x.clone()).shape == x.shape

def _loop(model, n, fail=None):
    opt = optim.SGD(model.parameters(), lr=0.1)
    for i, (xb, yb) in enumerate(synth(n).train):
        F.cross_entropy(model(xb), yb).backward(); opt.step(); opt.zero_grad()
        if fail is not None and i == 1: raise fail

def _no_hooks(model): return not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())

@pytest.mark.parametrize('fail', [None, RuntimeError('boom'), KeyboardInterrupt()])
def test_attach_plain_loop(fail):
    model = baseline_cnn()
    astats = ActivationStats(nn.Conv2d)
    try:
        with astats.attach(model): _loop(model, 4, fail)
    except BaseException as e: assert e is fail
    assert [len(h.stats[0]) for h in astats] == [4 if fail is None else 2] * 5
    assert _no_hooks(model)
    assert len(astats.diagnose()) == 5

def test_attach_eval_forwards_only_on_valid():
    model = baseline_cnn(); x = torch.randn(2, 1, 28, 28)
    a, b = ActivationStats(['0.0']), ActivationStats(['0.0'], on_valid=True)
    for s in (a, b):
        with s.attach(model), torch.no_grad(): model.train()(x); model.eval()(x); model.train()
    # the evaluation-mode forward is recorded only with on_valid, in a series of its own: `h.stats` and the plots read training
    assert len(a.hooks[0].stats[0]) == 1 and a.series('valid') == {} and _no_hooks(model)
    assert len(b.hooks[0].stats[0]) == 1 and len(b.series('valid')['0.0']) == 1

@pytest.mark.parametrize('kw,name', [(dict(hi=0), 'hi'), (dict(hi=math.nan), 'hi'), (dict(bins=0), 'bins'), (dict(bins=-1), 'bins'), (dict(every=0), 'every')])
def test_activation_stats_args(kw, name):
    with pytest.raises(ValueError, match=f'`{name}`'): ActivationStats(**kw)

def test_compiled_model_names():
    from miniai.hooks import select_modules
    model = baseline_cnn()
    assert [n for n, _ in select_modules(torch.compile(model), '0')] == ['0']
