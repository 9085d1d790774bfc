"A tiny conv net and a few SGD steps that note what each step saw: shared by the tests of parameter statistics (`ActivationStats` and the collector)."
import torch
from torch import nn
import torch.nn.functional as F

def convnet():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.Flatten(), nn.Linear(6 * 4 * 4, 5))

def sgd_steps(model, rec=None, n=3, lr=0.1, channels_last=False, layers=None):
    "`n` SGD steps on fixed random batches, under `rec.attach(model)` (with `layers` when given) when `rec` is given; returns what each step saw: layer 0's weight at the forward, its `.grad` after backward, its output."
    g = torch.Generator().manual_seed(1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    seen = dict(w=[], g=[], out=[])
    h = model[0].register_forward_hook(lambda m, i, o: seen['out'].append(o.detach().clone()))
    ctx = None if rec is None else rec.attach(model) if layers is None else rec.attach(model, layers)
    if ctx is not None: ctx.__enter__()
    try:
        for _ in range(n):
            x = torch.randn(8, 3, 8, 8, generator=g)
            if channels_last: x = x.contiguous(memory_format=torch.channels_last)
            seen['w'].append(model[0].weight.detach().clone())
            F.cross_entropy(model(x), torch.arange(8) % 5).backward()
            seen['g'].append(model[0].weight.grad.clone())
            opt.step(); opt.zero_grad()
    finally:
        if ctx is not None: ctx.__exit__(None, None, None)
        h.remove()
    return seen
