"""What the compile tests of the recorders share: the marks that skip them where torch cannot compile miniai's hooks, a tiny MLP,
three batches, and the steps run under `attach` with the model compiled inside the block (dynamo's 'aot_eager' backend: no C++
compiler)."""
import pytest, torch
from torch import nn

COMPILE_MARKS = [pytest.mark.usefixtures('one_thread'),
                 pytest.mark.skipif(not hasattr(torch, 'compile') or not hasattr(torch.library, 'custom_op'),
                                    reason='this torch has no torch.compile or no torch.library.custom_op')]

def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

XS = [torch.randn(16, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]

def run_attached(rec, compiled, backward=True):
    "`rec` attached to a fresh `net()`, compiled inside the block when `compiled`: a step (forward, backward) per batch of `XS` and a training-mode forward without grad; `backward=False`: the forwards of `XS` only, all without grad. Returns `rec`."
    m = net()
    with rec.attach(m):
        run = torch.compile(m, backend='aot_eager') if compiled else m     # compiled after attaching, inside the block
        if backward:
            for x in XS: run(x).sum().backward()
            with torch.no_grad(): run(XS[0])
        else:
            with torch.no_grad():
                for x in XS: run(x)
    return rec
