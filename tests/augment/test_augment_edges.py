"""Lesson 14's edges: `summary` on any module, keeping the model's modes and the callbacks' records; `capture_preds` and
`show_image_batch` the same; `rand_erase`/`rand_copy` refusing bad `pct`/`max_num`, on one pixel and on integer images."""
import random
import pytest, matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import torch, fastcore.all as fc
from torch import nn
from torch.nn import init
import torch.nn.functional as F

from miniai.datasets import DataLoaders
from miniai.learner import Learner, TrainCB, DeviceCB, set_seed
from miniai.init import BatchTransformCB
from miniai.activations import ActivationStats
from miniai.augment import summary, capture_preds, show_image_batch, CapturePreds, rand_erase, RandErase, rand_copy, RandCopy, _rand_square

pytestmark = pytest.mark.usefixtures('one_thread')

def synth(n=3, bs=8, n_valid=2):
    g = torch.Generator().manual_seed(0)
    b = [(torch.randn(bs, 1, 28, 28, generator=g), torch.randint(0, 10, (bs,), generator=g)) for _ in range(n)]
    return DataLoaders(b, b[:n_valid])

def body():
    return nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())

class Wrapper(nn.Module):
    "Not a Sequential: a body, a head and a parameter of its own."
    def __init__(self):
        super().__init__()
        self.body, self.head, self.scale = body(), nn.Linear(8, 10), nn.Parameter(torch.ones(1))
    def forward(self, x): return self.head(self.body(x)) * self.scale

class OneChild(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(body(), nn.Linear(8, 10))
    def forward(self, x): return self.net(x)

def learner(model, dls=None, cbs=()):
    set_seed(0)
    return Learner(model, dls or synth(), F.cross_entropy, lr=0.1, cbs=[TrainCB(), DeviceCB('cpu'), *cbs])

def test_summary_on_a_module_that_is_not_sequential(capsys):
    m = Wrapper()
    s = learner(m).summary()
    assert [r['module'] for r in s.rows] == ['Sequential', 'Linear']
    assert s.rows[0]['input'] == (8, 1, 28, 28) and s.rows[0]['output'] == (8, 8) and s.rows[1]['output'] == (8, 10)
    assert s.total_params == sum(p.numel() for p in m.parameters())   # with the wrapper's own `scale`
    assert s.rows[1]['params'] == 8*10 + 10 and s.rows[1]['mflops'] == pytest.approx(90/1e6)
    assert f'Tot params: {s.total_params}' in capsys.readouterr().out
    s1 = learner(OneChild()).summary()            # through a wrapper with one child: that child's blocks
    assert [r['module'] for r in s1.rows] == ['Sequential', 'Linear']
    lin = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    assert [r['output'] for r in learner(lin).summary().rows] == [(8, 784), (8, 10)]
    leaf = learner(nn.Linear(28, 5)).summary()    # no children: the model itself
    assert [(r['module'], r['output'], r['params']) for r in leaf.rows] == [('Linear', (8, 1, 28, 5), 145)]

def test_summary_and_capture_preds_keep_modes_records_and_optimiser():
    astats = ActivationStats(nn.ReLU)
    learn = learner(Wrapper(), cbs=[astats])
    learn.fit(1)
    recorded = [list(map(list, h.stats[:2])) for h in astats]
    assert [len(r[0]) for r in recorded] == [3, 3]
    learn.model.train(); learn.model.body[1].eval()             # a frozen batchnorm inside a training model
    modes = [m.training for m in learn.model.modules()]
    opt, stats = learn.opt, learn.model.body[1].running_mean.clone()
    learn.summary()
    preds, targs = learn.capture_preds()
    assert preds.shape == (16, 10) and targs.shape == (16,)
    assert [m.training for m in learn.model.modules()] == modes
    assert [list(map(list, h.stats[:2])) for h in astats] == recorded       # nothing reset, nothing added
    assert learn.opt is opt and torch.equal(learn.model.body[1].running_mean, stats)
    learn.model.eval(); learn.summary(); assert not any(m.training for m in learn.model.modules())

def test_passes_inside_attach_record_nothing():
    "summary's, capture_preds' and show_image_batch's passes are not recorded by an ActivationStats attached to the model."
    model = nn.Sequential(body(), nn.Linear(8, 10))
    astats = ActivationStats(nn.ReLU, on_valid=True)
    with astats.attach(model):
        model(torch.randn(4, 1, 28, 28))          # one recorded forward
        learn = learner(model)
        learn.summary(); learn.capture_preds()
        learn.show_image_batch(max_n=2); plt.close('all')
    assert [len(h.stats[0]) for h in astats] == [1, 1]

def test_summary_with_an_empty_validation_loader(capsys):
    m = Wrapper()
    s = learner(m, DataLoaders(synth().train, [])).summary()
    assert s.total_params == sum(p.numel() for p in m.parameters()) and s.rows[1]['params'] == 90
    assert all(r['input'] is None and r['output'] is None and r['mflops'] is None for r in s.rows) and s.total_mflops is None
    out = capsys.readouterr().out
    assert 'validation loader is empty' in out and '|Linear|None|None|90|-|' in out

def test_capture_preds_on_an_empty_loader():
    learn = learner(Wrapper(), DataLoaders(synth().train, []))
    with pytest.raises(ValueError, match='dls.valid'): learn.capture_preds()
    cp = CapturePreds()
    with pytest.raises(ValueError, match='no batch ran'): learn.fit(1, train=False, cbs=[cp])

def test_show_image_batch_shows_the_transformed_batch_without_training():
    learn = learner(Wrapper(), cbs=[BatchTransformCB(lambda b: (b[0] * 0 + 1, b[1]), on_valid=False)])
    w = [p.clone() for p in learn.model.parameters()]
    learn.model.eval()
    learn.show_image_batch(max_n=3)
    assert len(plt.gcf().axes) == 3 and all(torch.equal(a, b) for a, b in zip(w, learn.model.parameters()))
    assert (learn.batch[0] == 1).all() and not learn.model.training
    plt.close('all')
    with pytest.raises(ValueError, match='`max_n`'): learn.show_image_batch(max_n=0)

# ---- random erasing and copying ----
def course_rand_erase(x, pct=0.2, max_num=4):
    "The course's `rand_erase` (lesson 14), transcribed."
    def _rand_erase1(x, pct, xm, xs, mn, mx):
        szx, szy = int(pct*x.shape[-2]), int(pct*x.shape[-1])
        stx, sty = int(random.random()*(1-pct)*x.shape[-2]), int(random.random()*(1-pct)*x.shape[-1])
        init.normal_(x[:,:,stx:stx+szx,sty:sty+szy], mean=xm, std=xs)
        x.clamp_(mn, mx)
    xm, xs, mn, mx = x.mean(), x.std(), x.min(), x.max()
    num = random.randint(0, max_num)
    for i in range(num): _rand_erase1(x, pct, xm, xs, mn, mx)
    return x

def test_rand_erase_is_the_courses_and_in_place():
    x = torch.randn(8, 1, 28, 28)
    random.seed(5); torch.manual_seed(5); ours = x.clone(); out = rand_erase(ours, pct=0.3)
    random.seed(5); torch.manual_seed(5); course = course_rand_erase(x.clone(), pct=0.3)
    assert out is ours and torch.equal(ours, course) and not torch.equal(ours, x)   # in place, as the course's

@pytest.mark.parametrize('f', [rand_erase, rand_copy, RandErase, RandCopy])
@pytest.mark.parametrize('kw,err,name', [(dict(pct=1.5), ValueError, 'pct'), (dict(pct=-0.1), ValueError, 'pct'), (dict(pct=float('nan')), ValueError, 'pct'),
                                         (dict(pct='0.2'), TypeError, 'pct'), (dict(max_num=-1), ValueError, 'max_num'), (dict(max_num=2.5), TypeError, 'max_num')])
def test_bad_pct_and_max_num(f, kw, err, name):
    x = torch.randn(2, 1, 8, 8); x0 = x.clone()
    with pytest.raises(err, match=f'`{name}`'):
        if isinstance(f, type): f(**kw)
        else: f(x, **kw)
    assert torch.equal(x, x0)

@pytest.mark.parametrize('f', [rand_erase, rand_copy])
def test_one_pixel_empty_and_flat_inputs(f):
    for pct in (0.5, 1.0):
        x = torch.tensor([[[[0.25]]]])
        random.seed(1)
        for _ in range(5): f(x, pct=pct, max_num=4)
        assert torch.equal(x, torch.tensor([[[[0.25]]]]))   # one value: its noise has that mean and no spread, clipped to it
    e = torch.empty(0, 1, 4, 4); assert f(e) is e
    with pytest.raises(ValueError, match='at least 2 dims'): f(torch.randn(5))
    with pytest.raises(TypeError, match='`x`'): f([[0.5]])

def test_rand_erase_integer_images():
    x = torch.randint(10, 200, (4, 1, 16, 16), dtype=torch.uint8); x0 = x.clone()
    random.seed(0); torch.manual_seed(0)
    out = rand_erase(x, pct=0.5, max_num=4)
    assert out.dtype == torch.uint8 and out.min() >= x0.min() and out.max() <= x0.max() and not torch.equal(out, x0)
    xi = torch.randint(-5, 5, (2, 1, 6, 6), dtype=torch.int64); rand_erase(xi, pct=1.0, max_num=3)
    with pytest.raises(TypeError, match='torch.bool'): rand_erase(torch.zeros(2, 1, 4, 4, dtype=torch.bool))
    xc = x0.clone(); random.seed(0); rand_copy(xc, pct=0.5)
    assert set(xc.unique().tolist()) <= set(x0.unique().tolist())

def test_rand_copy_pastes_the_original_square_where_they_overlap():
    x = torch.arange(400.).view(1, 1, 20, 20); x0 = x.clone()
    for seed in range(40):
        random.seed(seed); n = random.randint(0, 1)
        if n == 0: continue
        (dx, dy), (sx, sy) = _rand_square(x, 0.5), _rand_square(x, 0.5)
        if dx.start == sx.start and dy.start == sy.start: continue
        if not (abs(dx.start - sx.start) < 10 and abs(dy.start - sy.start) < 10): continue   # the two squares overlap
        random.seed(seed); rand_copy(x, pct=0.5, max_num=1)
        assert torch.equal(x[..., dx, dy], x0[..., sx, sy])
        return
    pytest.fail('no seed gave overlapping squares')
