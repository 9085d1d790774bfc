"The kernel tests' reference: a tensor's statistics in exact rational arithmetic."
import math
from fractions import Fraction
import torch

def exact_stats(x, low=0.25, high=10., bounds_as_values=False):
    "Exact statistics of `x` as a kernel sees it (half types upcast exactly), in rational arithmetic: counts, NaN/±Inf, zeros, |x| < `low` and |x| >= `high`, and of the finite values mean, m2, min, max and the sum of |x|. `bounds_as_values`: `low` and `high` rounded first to the type the values are compared in (float32, or float64 for float64 tensors), as a kernel that compares in that type does."
    v = x.double().flatten().tolist()
    if bounds_as_values:
        t = torch.float64 if x.dtype == torch.float64 else torch.float32
        low, high = (torch.tensor(b, dtype=t).item() for b in (low, high))
    f = [Fraction(a) for a in v if math.isfinite(a)]
    r = dict(count=len(f), nan=sum(a != a for a in v), posinf=sum(a == math.inf for a in v), neginf=sum(a == -math.inf for a in v),
             zeros=sum(a == 0 for a in v), low=sum(abs(a) < low for a in f), high=sum(abs(a) >= high for a in f))
    if f:
        mean = sum(f) / len(f)
        r.update(mean=mean, m2=sum((a - mean)**2 for a in f), min=min(f), max=max(f), abs=sum(abs(a) for a in f))
    return r
