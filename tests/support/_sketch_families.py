"""The structured inputs of the collector's percentiles, shared by their test (tests/statistics/test_sketch_percentiles.py) and
their benchmark (bench/bench_sketch_sample.py): six kinds of 64 batches of 2^18+16 values, a tail unlike the head among them."""
import torch

QS = [50, 95, 99]   # the percentiles read

def families(g, nb=64, n=2**18 + 16):
    "64 batches of 2^18+16 values (16,778,240 in all) of each kind."
    r = lambda: torch.randn(n, generator=g)
    yield 'relu', [(r() * 2 + 0.5).relu() for _ in range(nb)]
    def heads():
        x = r().abs(); x[: n // 4] *= 10; return x                         # the first quarter ten times the rest
    yield 'heads', [heads() for _ in range(nb)]
    sc = torch.exp(torch.linspace(-2, 2, 64))                               # 64 columns of scales from 0.14 to 7.4
    yield 'columns', [(torch.randn(n // 64 + 1, 64, generator=g) * sc).abs().reshape(-1)[:n] for _ in range(nb)]
    yield 'sorted', [r().exp().sort().values for _ in range(nb)]
    yield 'heavy', [(1 - torch.rand(n, generator=g)).pow(-1 / 1.5) for _ in range(nb)]   # Pareto: tails like x^-1.5
    w = r().abs() * 0.05
    yield 'same', [w for _ in range(nb)]                                    # one tensor recorded 64 times (a weight)
