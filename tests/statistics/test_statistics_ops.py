"""How many torch ops a collector call costs on the torch path (MINIAI_KERNEL=torch, what a GPU runs): the kernel's one pass per
tensor, plus a few of the collector's own (a sample, or a copy of a small tensor, and the sketch's batched flush amortised)."""
import torch, pytest
from miniai import kernel
from miniai.kernel import Recorder
from miniai.testing import count_ops
from miniai.statistics import StatisticsConfig, StatisticsCollector

@pytest.fixture
def torch_ops(monkeypatch):
    monkeypatch.setenv('MINIAI_KERNEL', 'torch')

def _per_call(f, calls=32):
    for _ in range(4): f()                        # warm: streams made, the exact buffers released, sample tables drawn
    with count_ops() as co:
        for _ in range(calls): f()
    return co.n / calls

@pytest.mark.parametrize('sizes', [(2048, 40_000), (20_000, 40_000), (2048, 4096)], ids=['small-in', 'sampled', 'small'])
def test_collector_call_is_the_kernel_pass_and_a_few_ops(torch_ops, sizes):
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(n, generator=g) for n in sizes)
    c = StatisticsCollector(StatisticsConfig())
    per_call = _per_call(lambda: c.update_statistics('m', x, y))
    recs = [Recorder(fold=True, ranges=False) for _ in sizes]
    kernel_pass = _per_call(lambda: [r.record(t) for r, t in zip(recs, (x, y))])
    print(f'{sizes}: {per_call:.1f} ops per collector call, of which {kernel_pass:.1f} the kernel pass')
    assert per_call - kernel_pass <= 4 * len(sizes)          # ~19 for a small tensor before its copies were batched into the sketch
    if kernel_pass <= 2 * 24: assert per_call <= 60            # the budget, once the kernel pass is at most 24 ops per tensor
