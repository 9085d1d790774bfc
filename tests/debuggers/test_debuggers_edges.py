"""Debuggers at the edges: their own passes are not training batches, hooked models copy and save, bad numbers fail clearly, and the user's tensors stay bit-identical."""
import copy, io, math, os
from unittest import mock
import pytest, torch, torch.nn.functional as F
from torch import nn
import miniai.kernel as kernel
from miniai.core import paused_recording
from miniai.datasets import DataLoaders
from miniai.learner import Learner, TrainCB
from miniai.activations import ActivationStats, main_recorder
from miniai.monitoring import StatisticsCB
from miniai.debuggers import *
from miniai.debuggers import load_pages, SequentialDebugger, DebugCB   # miniai.sequential's, read from miniai.debuggers

def toy(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU()), nn.Sequential(nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU()),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3)).to(dtype)

def toy_dls(n=16, bs=8):
    g = torch.Generator().manual_seed(0)
    ds = list(zip(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)))
    return DataLoaders(torch.utils.data.DataLoader(ds, bs), torch.utils.data.DataLoader(ds, bs))

ALL = [{'name': 'fm', 'debugger_config': {'class': 'FeatureMapDebugger', 'args': {'layer': '0'}}},
       {'name': 'st', 'debugger_config': {'class': 'ActivationStatsDebugger', 'args': {'layer': '1'}}},
       {'name': 'cam', 'debugger_config': {'class': 'GradCAMDebugger', 'args': {'layer': '1'}}}]

def counts(debug, tmp_path):
    "Fit 2 epochs with ActivationStats and StatisticsCB (and a DebugCB on every batch when `debug`); what they counted."
    astats, scb = ActivationStats(['0', '1']), StatisticsCB(layers=['0', '1'])
    cbs = [TrainCB(), astats, scb]
    if debug: cbs.append(dcb := DebugCB(SequentialDebugger(100, ALL, path=tmp_path), batches=None, on_valid=True))
    Learner(toy(), toy_dls(), F.cross_entropy, lr=0.1, cbs=cbs).fit(2)
    if debug: assert len(load_pages(tmp_path)) == 8 and 'gradcam' in load_pages(tmp_path)[0]['results']['cam']   # the debugger ran on every batch
    st = scb.stats.get_all_statistics()
    return ([len(main_recorder(h)) for h in astats.hooks], scb.stats.call_count, {n: s.output_stats.count for n, s in st.items()})

def test_debugger_passes_are_not_training_batches(tmp_path):
    "GradCAM's forward and backward, and the forward debuggers' own forward, are recorded by no other miniai hook: each training batch once."
    want = counts(False, tmp_path/'no')
    assert want[0] == [4, 4] and want[1] == 4 * 2        # 2 epochs of 2 training batches, 2 layers
    assert counts(True, tmp_path/'debug') == want

def test_own_hooks_see_own_pass_only():
    model, x = toy(), torch.randn(2, 1, 8, 8)
    with paused_recording():   # called inside someone else's pause, a debugger still sees its own pass
        assert FeatureMapDebugger('0')({'inputs': x}, model)['feature_map'].shape == (2, 4, 8, 8)
        assert GradCAMDebugger('1')({'inputs': x}, model)['gradcam'].shape == (2, 8, 8)
    fm = FeatureMapDebugger('0').attach(model)
    with paused_recording(): model(x)                  # another tool's pass: not captured
    assert 'did not run' in fm.pop()['error']
    model(x)                                            # a training forward: captured
    assert fm.pop()['feature_map'].shape == (2, 4, 8, 8)
    fm.remove()

def test_hooked_model_copies_and_saves():
    model, x = toy(), torch.randn(2, 1, 8, 8)
    sd = SequentialDebugger(100, ALL).attach(model)
    twin = copy.deepcopy(model)
    buf = io.BytesIO(); torch.save(model, buf); buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for m in (twin, loaded): assert torch.equal(m(x), model(x))       # the copies run, and their hooks record nothing
    assert sd.debuggers['fm'].pop()['feature_map'].shape == (2, 4, 8, 8)
    sd.remove()

def test_deepcopy_in_a_callback_while_debugging(tmp_path):
    "A callback that copies the model mid-batch (EMA, keep-the-best) works while DebugCB's hooks are on it."
    from miniai.learner import Callback
    class Keep(Callback):
        order = 5
        def after_predict(self, learn): self.copy = copy.deepcopy(learn.model)
    keep = Keep()
    Learner(toy(), toy_dls(), F.cross_entropy, lr=0.1, cbs=[TrainCB(), DebugCB(SequentialDebugger(100, ALL, path=tmp_path)), keep]).fit(1)
    assert sum(len(m._forward_hooks) for m in keep.copy.modules()) in (0, 2)   # inert copies or none

BAD = [(FeatureMapDebugger, {'max_samples': v}, 'max_samples') for v in (-1, 0, 2.5, True, '3', math.nan)] + [
       (AttentionDebugger, {'weights_index': v}, 'weights_index') for v in (-1, 1.0, None)] + [
       (AttentionDebugger, {'eps': v}, 'eps') for v in (0, -1e-8, math.nan, math.inf, '1')] + [
       (ActivationStatsDebugger, {'n_samples': v}, 'n_samples') for v in (-1, 2.5, None)] + [
       (ActivationStatsDebugger, {'sat_low': v}, 'sat_low') for v in (math.nan, None, 2.)] + [
       (ActivationStatsDebugger, {'sat_high': v}, 'sat_high') for v in (math.inf, -1.)] + [
       (LayerOutputDebugger, {'downsample_factor': v}, 'downsample_factor') for v in (0, -2, 1.5, True)] + [
       (GradCAMDebugger, {'target_class': v}, 'target_class') for v in (-1, 1.5, True, [0.5, 1.], 'cat', [[0, 1]], [-1, 2])]

@pytest.mark.parametrize('cls,kw,name', BAD, ids=[f'{c.__name__}-{k}={v!r}' for c, kw, _ in BAD for k, v in kw.items()])
def test_bad_numbers_name_the_argument(cls, kw, name):
    with pytest.raises(ValueError, match=name): cls('0', **kw)

def test_good_numbers_are_kept():
    assert FeatureMapDebugger('0', max_samples=2).max_samples == 2 and FeatureMapDebugger('0').max_samples is None
    assert ActivationStatsDebugger('0', n_samples=0, sat_low=-2, sat_high=3).n_samples == 0
    assert GradCAMDebugger('1', target_class=[0, 2]).target_class == [0, 2]
    assert GradCAMDebugger('1', target_class=torch.tensor([1, 0])).target_class.tolist() == [1, 0]
    with pytest.raises(TypeError, match='normalize'): GradCAMDebugger('1', normalize=1)
    fm = FeatureMapDebugger('0', max_samples=1)({'inputs': torch.randn(3, 1, 8, 8)}, toy())
    assert fm['feature_map'].shape == (1, 4, 8, 8)

@pytest.mark.parametrize('kw,name', [({'every_epoch': 0}, 'every_epoch'), ({'n_inp': 0}, 'n_inp'), ({'n_inp': 1.0}, 'n_inp'),
                                     ({'batches': 0}, 'batches'), ({'batches': [-1]}, 'batches'), ({'batches': [0.5]}, 'batches'),
                                     ({'epochs': 3}, 'epochs'), ({'epochs': ['0']}, 'epochs')])
def test_debugcb_bad_numbers(kw, name):
    with pytest.raises(ValueError, match=name): DebugCB(SequentialDebugger(100, ALL), **kw)

@pytest.mark.parametrize('size', [0, -1, math.nan, -math.inf, True, '1'])
def test_sequential_debugger_page_size(size):
    with pytest.raises(ValueError, match='page_size_mb'): SequentialDebugger(size, ALL)

# --- the user's tensors stay bit-identical -------------------------------------------------------------------------------
class Attn(nn.Module):
    def forward(self, t):
        w = torch.softmax(t @ t.transpose(1, 2) / 2, -1)
        return w @ t, w

class Net(nn.Module):
    "Convolutions, then attention over the positions, then a linear head: every debugger has a layer to watch."
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, padding=1), nn.ReLU())
        self.att, self.head = Attn(), nn.Linear(6, 3)
    def forward(self, x):
        t, w = self.att(self.body(x).flatten(2).transpose(1, 2))
        return self.head(t.mean(1))

DEBUGGERS = {'feature_map': ('FeatureMapDebugger', {'layer': 'body.1', 'max_samples': 2}),
             'attention': ('AttentionDebugger', {'layer': 'att'}),
             'activation_stats': ('ActivationStatsDebugger', {'layer': 'body.2'}),
             'layer_output': ('LayerOutputDebugger', {'layer': 'body.3', 'downsample_factor': 2}),
             'gradcam': ('GradCAMDebugger', {'layer': 'body.2'})}

def bits(t):
    t = t.detach()
    return t.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).clone()

def step(model, x, y, sd=None):
    "A training step's forward and backward (with the debugger collecting between them); the bits of inputs, outputs and gradients."
    x = x.clone().requires_grad_()
    if sd is not None: sd.attach(model)
    out = model(x)
    seen = {'input': bits(x), 'output': bits(out)}
    if sd is not None:
        res = sd.collect({'inputs': x, 'outputs': out, 'targets': y}, model)['results']
        sd.remove()
        assert not any('error' in r for r in res.values()), res
        assert torch.equal(bits(x), seen['input']) and torch.equal(bits(out), seen['output'])
    F.cross_entropy(out.float(), y).backward()
    seen.update({'input grad': bits(x.grad), **{f'{n}.grad': bits(p.grad) for n, p in model.named_parameters()}})
    if sd is not None: sd.flush()       # the host copies are made now: still nothing written into the user's tensors
    return {**seen, 'input after': bits(x), 'output after': bits(out)}

@pytest.mark.parametrize('fused', [True, False], ids=['fused', 'torch'])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_user_tensors_bit_identical(dtype, fused, tmp_path):
    "Every debugger at once, in one training step: the inputs, outputs and gradients are the bits of the same step without them."
    torch.manual_seed(0)
    model = Net().to(dtype)
    x, y = torch.randn(3, 2, 6, 6).to(dtype), torch.tensor([0, 2, 1])
    x[0, 0, 0, :2] = torch.tensor([math.nan, math.inf])   # non-finite values too: a debugger's statistics must not clean them in place
    want = step(copy.deepcopy(model), x, y)
    config = [{'name': name, 'debugger_config': {'class': cls, 'args': args}} for name, (cls, args) in DEBUGGERS.items()]
    with mock.patch.dict(os.environ, MINIAI_KERNEL='loops' if fused else 'torch'):
        got = step(model, x, y, SequentialDebugger(100, config, path=tmp_path))
    assert list(got) == list(want)
    for k in want: assert torch.equal(got[k], want[k]), f'{k} changed'
    assert sorted(load_pages(tmp_path)[0]['results']) == sorted(DEBUGGERS)   # every debugger ran

def test_gradcam_in_training_mode_leaves_batchnorm_statistics():
    "GradCAM(eval_mode=False) runs the model in training mode: BatchNorm's running statistics are put back, bit for bit."
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    model(torch.randn(8, 1, 6, 6))                       # running statistics away from their initial values
    before = {n: bits(b) for n, b in model.named_buffers()}
    res = GradCAMDebugger('2', eval_mode=False)({'inputs': torch.randn(4, 1, 6, 6)}, model)
    assert res['gradcam'].shape == (4, 6, 6) and model.training
    assert all(torch.equal(bits(b), before[n]) for n, b in model.named_buffers())

def test_dumps_save_no_micro_step_for_a_debugger_pass(tmp_path):
    "With a saving hook on the model, a fit with DebugCB(GradCAM) saves the same micro-steps and tensors as the fit without it."
    from miniai.dumps import register_saving_hook
    def saved(debug):
        model = toy()
        hook = register_saving_hook(model, tmp_path/f'dump_{debug}', max_saved_tensors=1000, max_saved_grads=1000).saving_hook
        cbs = [TrainCB()] + ([DebugCB(SequentialDebugger(100, ALL, path=tmp_path/'pages'), batches=None, on_valid=True)] if debug else [])
        try: Learner(model, toy_dls(), F.cross_entropy, lr=0.1, cbs=cbs).fit(1)
        finally: hook.remove()
        return hook.micro_step, hook.n_tensors, hook.n_grads
    want = saved(False)
    assert want[0] == 3        # 2 training and 2 validation forwards: micro-steps 0 to 3
    assert saved(True) == want
