"""Structured inputs whose head is unlike their tail: the moments stay exact on both kernel paths (the torch path is what
every GPU runs). A one-pass shift by the first value lost up to 5e-7 of m2 here; the corrected two-pass formula does not."""
from fractions import Fraction
import pytest, torch
from miniai.kernel import batch_moments, use_kernel

def truth(x):
    "Exact mean and m2 of the values of `x`, in rational arithmetic."
    v = [Fraction(a) for a in x.double().flatten().tolist()]
    n, s = len(v), sum(v, Fraction(0))
    return float(s / n), float(sum((a * a for a in v), Fraction(0)) - s * s / n)

def cases(dtype):
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(20_000, generator=g, dtype=dtype)
    big = 1e8 if dtype == torch.float64 else 1e4
    yield 'head 0, tail large', torch.cat([torch.zeros(1, dtype=dtype), big + noise])
    yield 'head large, tail small', torch.cat([torch.full((1,), big, dtype=dtype), noise])
    yield 'NaN head, large tail', torch.cat([torch.full((1,), float('nan'), dtype=dtype), big + noise])
    yield 'columns unlike each other', torch.stack([noise, big + noise], 1)

@pytest.mark.parametrize('kernel', ['loops', 'torch'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64], ids=['f32', 'f64'])
def test_heads_unlike_tails_stay_exact(kernel, dtype):
    for name, x in cases(dtype):
        mean, m2 = truth(x[torch.isfinite(x)])
        with use_kernel(kernel): m = batch_moments(x)
        assert abs(m.m2.item() - m2) <= 1e-13 * m2, (name, m.m2.item(), m2)
        assert abs(m.mean.item() - mean) <= 1e-13 * abs(mean) + 1e-300, (name, m.mean.item(), mean)
