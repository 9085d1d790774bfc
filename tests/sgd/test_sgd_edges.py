"""Lesson 12's edges: the optimisers' argument checks (matching torch.optim's words), their state kept in the optimiser
(bit-identical to the course's, fresh for a new optimiser), the schedulers' `total_steps` and `fit(0)`, RecorderCB's errors."""
import copy, itertools, math
from functools import partial
import pytest, matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import torch, fastcore.all as fc
from torch import nn, optim
import torch.nn.functional as F
from torch.optim import lr_scheduler

from miniai.datasets import fashion_dls, DataLoaders
from miniai.learner import Learner, TrainCB, Callback, set_seed
from miniai.sgd import SGD, Momentum, RMSProp, Adam, BatchSchedCB, EpochSchedCB, RecorderCB

pytestmark = pytest.mark.usefixtures('one_thread')

# ---- the course's optimisers (lesson 12, course22p2 `12_accel_sgd`), transcribed: their state lives on the parameter ----
class CourseSGD:
    def __init__(self, params, lr, wd=0.):
        params = list(params)
        fc.store_attr()
        self.i = 0
    def step(self):
        with torch.no_grad():
            for p in self.params:
                self.reg_step(p)
                self.opt_step(p)
        self.i +=1
    def opt_step(self, p): p -= p.grad * self.lr
    def reg_step(self, p):
        if self.wd != 0: p *= 1 - self.lr*self.wd
    def zero_grad(self):
        for p in self.params: p.grad.data.zero_()

class CourseMomentum(CourseSGD):
    def __init__(self, params, lr, wd=0., mom=0.9):
        super().__init__(params, lr=lr, wd=wd)
        self.mom=mom
    def opt_step(self, p):
        if not hasattr(p, 'grad_avg'): p.grad_avg = torch.zeros_like(p.grad)
        p.grad_avg = p.grad_avg*self.mom + p.grad*(1-self.mom)
        p -= self.lr * p.grad_avg

class CourseRMSProp(CourseSGD):
    def __init__(self, params, lr, wd=0., sqr_mom=0.99, eps=1e-5):
        super().__init__(params, lr=lr, wd=wd)
        self.sqr_mom,self.eps = sqr_mom,eps
    def opt_step(self, p):
        if not hasattr(p, 'sqr_avg'): p.sqr_avg = p.grad**2
        p.sqr_avg = p.sqr_avg*self.sqr_mom + p.grad**2*(1-self.sqr_mom)
        p -= self.lr * p.grad/(p.sqr_avg.sqrt() + self.eps)

class CourseAdam(CourseSGD):
    def __init__(self, params, lr, wd=0., beta1=0.9, beta2=0.99, eps=1e-5):
        super().__init__(params, lr=lr, wd=wd)
        self.beta1,self.beta2,self.eps = beta1,beta2,eps
    def opt_step(self, p):
        if not hasattr(p, 'avg'): p.avg = torch.zeros_like(p.grad.data)
        if not hasattr(p, 'sqr_avg'): p.sqr_avg = torch.zeros_like(p.grad.data)
        p.avg = self.beta1*p.avg + (1-self.beta1)*p.grad
        unbias_avg = p.avg / (1 - (self.beta1**(self.i+1)))
        p.sqr_avg = self.beta2*p.sqr_avg + (1-self.beta2)*(p.grad**2)
        unbias_sqr_avg = p.sqr_avg / (1 - (self.beta2**(self.i+1)))
        p -= self.lr * unbias_avg / (unbias_sqr_avg + self.eps).sqrt()

@pytest.fixture(scope='module')
def fashion_batches():
    "Six real FashionMNIST training batches of 64 images."
    return list(itertools.islice(fashion_dls(64).train, 6))

def small_cnn():
    set_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

def train(model, opt, batches):
    for xb, yb in batches:
        F.cross_entropy(model(xb), yb).backward(); opt.step(); opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]

PAIRS = [(SGD, CourseSGD, dict(lr=0.1, wd=0.01)), (Momentum, CourseMomentum, dict(lr=0.1, wd=0.01, mom=0.85)),
         (RMSProp, CourseRMSProp, dict(lr=3e-3, wd=0.01)), (Adam, CourseAdam, dict(lr=3e-3, wd=0.01, beta2=0.95))]

@pytest.mark.parametrize('ours,course,kw', PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_one_optimiser_is_bit_identical_to_the_course(fashion_batches, ours, course, kw):
    m1, m2 = small_cnn(), small_cnn()
    w_ours = train(m1, ours(m1.parameters(), **kw), fashion_batches)
    w_course = train(m2, course(m2.parameters(), **kw), fashion_batches)
    assert all(torch.equal(a, b) for a, b in zip(w_ours, w_course))
    assert not any(torch.equal(a, b) for a, b in zip(w_ours, small_cnn().parameters()))   # the weights did move
    assert not any(hasattr(p, n) for p in m1.parameters() for n in ('grad_avg', 'sqr_avg', 'avg'))   # nothing left on the parameters

@pytest.mark.parametrize('ours,course,kw', PAIRS[1:], ids=[p[0].__name__ for p in PAIRS[1:]])
def test_a_new_optimiser_starts_fresh(fashion_batches, ours, course, kw):
    "After one optimiser's steps, a new one on the same parameters steps as a new one on a copy of them (the course's does not)."
    first, rest = fashion_batches[:3], fashion_batches[3:]
    m = small_cnn(); train(m, ours(m.parameters(), **kw), first)
    m_copy = copy.deepcopy(m)
    w_again = train(m, ours(m.parameters(), **kw), rest)
    w_fresh = train(m_copy, ours(m_copy.parameters(), **kw), rest)
    assert all(torch.equal(a, b) for a, b in zip(w_again, w_fresh))
    c = small_cnn(); train(c, course(c.parameters(), **kw), first)
    c_copy = copy.deepcopy(c)
    for p in c_copy.parameters():   # the fresh course optimiser's parameters: no averages carried over
        for n in ('grad_avg', 'sqr_avg', 'avg'):
            if hasattr(p, n): delattr(p, n)
    assert not all(torch.equal(a, b) for a, b in zip(train(c, course(c.parameters(), **kw), rest), train(c_copy, course(c_copy.parameters(), **kw), rest)))

def test_state_is_per_optimiser_and_first_step_matches_torch():
    w = torch.tensor([1., -2.], requires_grad=True)
    opt = Momentum([w], lr=0.1, mom=0.9)
    (w * torch.tensor([3., 4.])).sum().backward(); opt.step()
    assert list(opt.state) == [w] and set(opt.state[w]) == {'grad_avg'}
    assert Momentum([w], lr=0.1).state == {}
    w2 = torch.tensor([1., -2.], requires_grad=True); (w2 * torch.tensor([3., 4.])).sum().backward()
    optim.SGD([w2], lr=0.1*0.1).step()   # the course's momentum's first step is SGD at lr*(1-mom)
    assert torch.allclose(w.detach(), w2.detach())

def _p(): return [torch.zeros(3, requires_grad=True)]

# (our optimiser and arguments, the argument named, torch's optimiser given the same value: its words must be in ours;
#  None where torch accepts the value: its SGD takes a NaN learning rate or weight decay, and every weight becomes NaN)
BAD = [(SGD, dict(lr=-0.1), 'lr', lambda: optim.SGD(_p(), lr=-0.1)),
       (SGD, dict(lr=math.nan), 'lr', None),
       (Adam, dict(lr=math.nan), 'lr', lambda: optim.Adam(_p(), lr=math.nan)),
       (SGD, dict(lr=0.1, wd=-1e-4), 'wd', lambda: optim.SGD(_p(), lr=0.1, weight_decay=-1e-4)),
       (Momentum, dict(lr=0.1, wd=math.nan), 'wd', None),
       (Momentum, dict(lr=0.1, mom=-0.5), 'mom', lambda: optim.SGD(_p(), lr=0.1, momentum=-0.5)),
       (RMSProp, dict(lr=0.1, sqr_mom=-0.1), 'sqr_mom', lambda: optim.RMSprop(_p(), lr=0.1, alpha=-0.1)),
       (RMSProp, dict(lr=0.1, eps=-1e-5), 'eps', lambda: optim.RMSprop(_p(), lr=0.1, eps=-1e-5)),
       (Adam, dict(lr=0.1, beta1=1.0), 'beta1', lambda: optim.Adam(_p(), lr=0.1, betas=(1.0, 0.99))),
       (Adam, dict(lr=0.1, beta2=-0.2), 'beta2', lambda: optim.Adam(_p(), lr=0.1, betas=(0.9, -0.2))),
       (Adam, dict(lr=0.1, eps=-1.), 'eps', lambda: optim.Adam(_p(), lr=0.1, eps=-1.))]

@pytest.mark.parametrize('cls,kw,name,torch_opt', BAD, ids=[f'{b[0].__name__}-{b[2]}={list(b[1].values())[-1]}' for b in BAD])
def test_bad_hyperparameters_refused_in_torchs_words(cls, kw, name, torch_opt):
    w = torch.tensor([1., 2.], requires_grad=True)
    with pytest.raises(ValueError, match=f'`{name}`') as err: cls([w], **kw)
    if torch_opt is not None:
        with pytest.raises(ValueError) as torch_err: torch_opt()
        assert str(torch_err.value) in str(err.value)
    else: assert 'Invalid' in str(err.value) and 'nan' in str(err.value)
    assert torch.equal(w.detach(), torch.tensor([1., 2.]))

@pytest.mark.parametrize('cls,kw,name', [(Momentum, dict(mom=1.0), 'mom'), (RMSProp, dict(sqr_mom=1.5), 'sqr_mom'), (SGD, dict(lr=math.inf), 'lr')])
def test_averages_and_lr_out_of_range(cls, kw, name):
    "A moving average's weight on the past must be below 1 (1 never learns), and an infinite learning rate is refused too."
    with pytest.raises(ValueError, match=f'`{name}`'): cls(_p(), **{'lr': 0.1, **kw})

def test_bad_types_and_params():
    with pytest.raises(TypeError, match='`lr`'): SGD(_p(), lr='0.1')
    with pytest.raises(TypeError, match='`mom`'): Momentum(_p(), lr=0.1, mom=None)
    with pytest.raises(TypeError, match='single tensor'): SGD(torch.zeros(3, requires_grad=True), lr=0.1)
    with pytest.raises(ValueError, match='empty parameter list'): Adam([], lr=0.1)
    with pytest.raises(TypeError, match='`params`'): Adam([1.0], lr=0.1)

# ---- schedulers ----
def synth(n=4, bs=16):
    g = torch.Generator().manual_seed(0)
    b = [(torch.randn(bs, 1, 28, 28, generator=g), torch.randint(0, 10, (bs,), generator=g)) for _ in range(n)]
    return DataLoaders(b, b[:1])

class LRs(Callback):
    order = 100
    def before_fit(self, learn): self.lrs = []
    def after_batch(self, learn):
        if learn.training: self.lrs.append(learn.opt.param_groups[0]['lr'])

def fit_lrs(cb, epochs=2, dls=None):
    set_seed(1); rec = LRs()
    learn = Learner(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), dls or synth(), F.cross_entropy, lr=0.1, cbs=[TrainCB(), cb, rec], opt_func=optim.AdamW)
    learn.fit(epochs)
    return rec.lrs, learn

def test_onecycle_partial_gets_total_steps():
    lrs, _ = fit_lrs(BatchSchedCB(partial(lr_scheduler.OneCycleLR, max_lr=0.1)))
    explicit, _ = fit_lrs(BatchSchedCB(partial(lr_scheduler.OneCycleLR, max_lr=0.1, total_steps=8)))
    assert len(lrs) == 8 and lrs == explicit and max(lrs) > lrs[0] > lrs[-1]
    given, _ = fit_lrs(BatchSchedCB(partial(lr_scheduler.OneCycleLR, max_lr=0.1, epochs=2, steps_per_epoch=4)))
    assert given == explicit     # epochs and steps_per_epoch given: nothing filled in, the same schedule
    per_epoch, _ = fit_lrs(EpochSchedCB(partial(lr_scheduler.OneCycleLR, max_lr=0.1)))
    assert len(set(per_epoch[:4])) == 1 and len(set(per_epoch[4:])) == 1 and per_epoch[4] != per_epoch[0]   # total_steps = 2 epochs

@pytest.mark.parametrize('cb', [lambda: BatchSchedCB(partial(lr_scheduler.OneCycleLR, max_lr=0.1)), lambda: EpochSchedCB(partial(lr_scheduler.OneCycleLR, max_lr=0.1)),
                                lambda: BatchSchedCB(partial(lr_scheduler.OneCycleLR, max_lr=0.1, total_steps=8))])
def test_fit_zero_epochs_with_a_schedule(cb):
    cb = cb()
    lrs, learn = fit_lrs(cb, epochs=0)
    assert lrs == []
    if 'total_steps' in cb.sched.keywords: assert learn.opt.param_groups[0]['lr'] == pytest.approx(0.1/25)   # built: its starting lr
    else: assert cb.schedo is None and learn.opt.param_groups[0]['lr'] == 0.1    # nothing to schedule: not built

def test_sched_not_callable():
    with pytest.raises(TypeError, match='`sched`'): BatchSchedCB(0.1)

# ---- RecorderCB ----
def test_recorder_needs_names_and_functions():
    with pytest.raises(ValueError, match='name=function'): RecorderCB()
    with pytest.raises(TypeError, match='`lr`'): RecorderCB(lr=0.1)

def test_recorder_plot_before_fit_is_empty_and_pg_says_why():
    rec = RecorderCB(lr=lambda cb: cb.pg['lr'], mom=lambda cb: cb.pg['betas'][0])
    rec.plot()
    axs = rec.fig.axes
    assert [a.get_title() for a in axs] == ['lr', 'mom'] and all(len(a.lines[0].get_xdata()) == 0 for a in axs)
    assert all('no training batch' in a.texts[0].get_text() for a in axs)
    with pytest.raises(AttributeError, match='pg'): rec.pg
    plt.close('all')

def test_recorder_with_the_course_optimiser():
    "The course's SGD has no param groups: a recorder reading `cb.pg` says so; one reading the loss records."
    dls = synth()
    loss_rec = RecorderCB(loss=lambda cb: cb.learn.loss.item())
    Learner(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), dls, F.cross_entropy, lr=0.1, cbs=[TrainCB(), loss_rec], opt_func=SGD).fit(1)
    assert len(loss_rec.recs['loss']) == 4
    lr_rec = RecorderCB(lr=lambda cb: cb.pg['lr'])
    learn = Learner(nn.Sequential(nn.Flatten(), nn.Linear(784, 10)), dls, F.cross_entropy, lr=0.1, cbs=[TrainCB(), lr_rec], opt_func=SGD)
    with pytest.raises(AttributeError, match='torch.optim'): learn.fit(1)
    rec = RecorderCB(lr=lambda cb: cb.pg['lr'])
    _, learn = fit_lrs(rec)
    rec.plot(); assert len(rec.recs['lr']) == 8 and len(rec.fig.axes[0].texts) == 0
    plt.close('all')
