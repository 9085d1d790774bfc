"""No miniai hook writes into a tensor it did not allocate, and a hooked model still copies and saves.

Every recorder, collector, dumper and debugger watches the same small CNN, on both kernel paths (the compiled CPU loop and
the torch ops every GPU runs) and in every float dtype. The run with the tool must leave the user's input, every layer's
output and output gradient, the parameters' gradients and the loss bit-identical to the same run without it."""
import copy, io, os, tempfile, warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path
import pytest, torch
import torch.nn.functional as F
from torch import nn
from miniai import kernel
from miniai.activations import ActivationStats
from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
from miniai.dumps import register_saving_hook
from miniai.debuggers import FeatureMapDebugger, ActivationStatsDebugger, GradCAMDebugger

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]

def _model(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 8, 3, stride=2), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8*5*5, 10)).to(dtype)

def _inputs(dtype):
    "Structured, not random: a large-mean column, a constant stripe, heads unlike tails, and a strided (transposed) view."
    x = torch.arange(2*12*12, dtype=torch.float64).reshape(2, 1, 12, 12) / 37.
    x[:, :, :, 0] += 300.; x[:, :, 5] = -2.; x[1] *= -0.5
    x = x.transpose(2, 3).to(dtype)                  # not contiguous: the hooks see a strided tensor
    return x, torch.tensor([3, 7])

@contextmanager
def _kernel_path(fused):
    old = os.environ.get('MINIAI_KERNEL')
    os.environ['MINIAI_KERNEL'] = 'loops' if fused else 'torch'      # every thread, the backward's too
    try: yield
    finally:
        if old is None: del os.environ['MINIAI_KERNEL']
        else: os.environ['MINIAI_KERNEL'] = old

def _step(model, x, y):
    "One training step's forward and backward, capturing what the user can see: each layer's output and output gradient."
    outs, grads, handles = [], [], []
    def keep(m, i, o):
        outs.append(o.detach().clone())
        if o.requires_grad: o.register_hook(lambda g: grads.append(g.clone()))
    for m in model: handles.append(m.register_forward_hook(keep))    # registered after the tool's: sees what it left
    x_before = x.clone()
    try:
        xg = x.detach().requires_grad_()
        loss = F.cross_entropy(model(xg).float(), y)
        loss.backward()
    finally:
        for h in handles: h.remove()
    assert torch.equal(x, x_before)
    return dict(loss=loss.detach(), outs=outs, grads=grads, xgrad=xg.grad, pgrads=[p.grad.clone() for p in model.parameters()])

def _same(a, b, what):
    if isinstance(a, list):
        assert len(a) == len(b), what
        for i, (u, v) in enumerate(zip(a, b)): _same(u, v, f'{what}[{i}]')
    else: assert torch.equal(a, b), f'{what} changed'

def _copies_and_saves(model):
    twin = copy.deepcopy(model)
    buf = io.BytesIO(); torch.save(model, buf); buf.seek(0)
    return twin, torch.load(buf, weights_only=False)

def _tools(dtype):
    "Each tool as a function that hooks `model` within an ExitStack and returns what to check it recorded."
    tmp = Path(tempfile.mkdtemp())
    def astats(stack, model, grads):
        cb = ActivationStats(nn.Conv2d, output_grads=grads)
        stack.enter_context(cb.attach(model)); return cb
    def collector(stack, model):
        st = ActivationStatisticsHook(StatisticsConfig(collect_histogram=True, collect_sparsity=True, collect_percentiles=[1, 50, 99]))
        stack.enter_context(st.attach(model)); return st
    def saving(stack, model):
        register_saving_hook(model, tmp/f'dump_{len(list(tmp.iterdir()))}', max_saved_tensors=20, max_saved_grads=20)
        stack.callback(model.saving_hook.remove); return model.saving_hook
    def debuggers(stack, model):
        fm, ad = FeatureMapDebugger('0'), ActivationStatsDebugger('2')
        stack.enter_context(fm.attach(model)); stack.enter_context(ad.attach(model)); return fm
    return {'ActivationStats': lambda s, m: astats(s, m, False), 'ActivationStats(output_grads=True)': lambda s, m: astats(s, m, True),
            'ActivationStatisticsHook': collector, 'SavingHook': saving, 'debuggers': debuggers}

TOOL_NAMES = list(_tools(torch.float32))

@pytest.mark.parametrize('fused', [True, False], ids=['cpu-loop', 'torch-ops'])
@pytest.mark.parametrize('dtype', DTYPES, ids=[str(d)[6:] for d in DTYPES])
def test_hooks_leave_user_tensors_bit_identical(dtype, fused):
    x, y = _inputs(dtype)
    with _kernel_path(fused), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        ref = _step(_model(dtype), x, y)
        for name, tool in _tools(dtype).items():
            model = _model(dtype)
            with ExitStack() as stack:
                tool(stack, model)
                got = _step(model, x, y)
                twin, loaded = _copies_and_saves(model)          # hooked: the model still copies and saves
            for k in ref: _same(got[k], ref[k], f'{name} ({dtype}, fused={fused}): {k}')
            _copies_and_saves(model)                              # and after the hooks are removed
            for m in (twin, loaded): m.zero_grad(); _same(_step(m, x, y)['loss'], ref['loss'], f'{name}: the copy computes the same loss')

@pytest.mark.parametrize('dtype', DTYPES, ids=[str(d)[6:] for d in DTYPES])
def test_gradcam_leaves_model_and_gradients_untouched(dtype):
    x, y = _inputs(dtype)
    model = _model(dtype)
    ref = _step(model, x, y)                                     # the user's gradients, accumulated in .grad
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    res = GradCAMDebugger('2', target_class=1)({'inputs': x}, model)
    assert 'gradcam' in res, res
    assert model.training and all(m.training for m in model.modules())
    _same([p.grad for p in model.parameters()], ref['pgrads'], f'GradCAM ({dtype}): parameter gradients')
    for k, v in model.state_dict().items(): assert torch.equal(v, state[k]), k
