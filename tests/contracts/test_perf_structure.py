"""What keeps the hooks near one read of their tensors, checked by structure rather than by the clock: on the CPU the
collector's sketch sample is bucketed inside the kernel's one compiled pass (no torch op reads the tensor, nothing is copied
or kept pending), every value lands in a sketch bucket whose bounds hold it, the fused sketch agrees with the torch ops'
one, and a recorder's state stays bounded however many batches it records."""
import importlib.util, math, numpy as np, torch, pytest
from torch.utils._python_dispatch import TorchDispatchMode
from miniai import kernel
from miniai.kernel import Recorder, use_kernel
from miniai.sketch import SketchRecorder, QuantileSketch, _skp
from miniai.statistics import StatisticsConfig, StatisticsCollector
from miniai.testing import count_ops

pytestmark = pytest.mark.skipif(importlib.util.find_spec('numba') is None, reason='the compiled loops need numba')

class _largest(TorchDispatchMode):
    "The largest number of elements any torch op inside the block writes."
    def __init__(self): super().__init__(); self.most = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor) and not func.is_view: self.most = max(self.most, t.numel())
        return out

def _acts(n=3, size=(64, 16, 14, 14), seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*size, generator=g).relu() * (i + 1) for i in range(n)]

def test_collector_call_on_the_cpu_is_one_compiled_pass_per_tensor():
    "A default collector call on sampled tensors: no torch op reads the tensors, none writes more than a few values, nothing waits in a pending list."
    xs = _acts(6)
    c = StatisticsCollector(StatisticsConfig())
    with use_kernel('loops'):
        for x in xs[:2]: c.update_statistics('m', x, x * 2)        # streams made, exact buffers released
        for s in c._streams.values():                                # every row of the sample tables drawn (each is drawn once, when first sampled)
            for row in range(kernel.TABLE_ROWS): s.sample_index(xs[0].numel(), row)
        with count_ops() as co, _largest() as big:
            for x in xs[2:]: c.update_statistics('m', x, x)
    assert co.n <= 2 * 4, co.ops                                # the few small ops of the bookkeeping, no pass of torch ops
    assert big.most <= 64, big.most                             # no copy of the input, no sample gathered by torch
    for s in c._streams.values(): assert s._pending == [] and s._whole == []   # bucketed at once, not pending


def test_sketchrecorder_keeps_nothing_per_batch():
    "Two hundred batches: the recorder's folded rows, tables and sketch stay the same size; the sampling record is one tensor added to in place."
    r = SketchRecorder()
    x = torch.randn(40_000, generator=torch.Generator().manual_seed(1))
    with use_kernel('loops'):
        r.record(x)
        acc = r.sampling
        for _ in range(200): r.record(x)
    assert r.sampling is acc and len(r._tables) <= 4 and len(r._rows) < r.fold_every
    assert r.sketch.counts.shape == (2 * r.sketch.k + 1,) and r._pending == [] and r._whole == []
    k, w, w2 = r.sampling.tolist()
    assert k == 201 * 16384 and math.isclose(w, 201 * 40_000, rel_tol=1e-12)


def test_a_merged_sampling_record_is_copied_before_it_is_added_to():
    "A recorder whose sampling record came from another (merge) copies it before adding in place: the other's stays as it was."
    xs = _acts(2, (40_000,))
    a, b = SketchRecorder(), SketchRecorder()
    with use_kernel('loops'):
        b.record(xs[0])
        before = b.sampling.clone()
        a.merge(b)
        a.record(xs[1])
    assert torch.equal(b.sampling, before) and a.sampling[0] == 2 * 16384


@pytest.mark.parametrize('level', [0, 1, 3])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_every_value_lands_in_a_bucket_that_holds_it(level, dtype):
    "Values at, just below and just above every bucket edge, and beyond the sketch's range: the compiled loop puts each in a bucket whose bounds hold it."
    sk = QuantileSketch(level=level)
    lo, hi = sk.bucket_bounds()
    k = sk.k
    edges = np.concatenate([lo[k + 1:k + 400], hi[k + 1:k + 400], lo[-400:], [1e-40, 1e-30, 3e-10, 1e10, 1e30]])
    v = torch.tensor(edges, dtype=dtype)
    near = torch.cat([v, torch.nextafter(v, torch.zeros_like(v)), torch.nextafter(v, torch.full_like(v, math.inf))])
    vals = torch.cat([near, -near, torch.tensor([0., -0.], dtype=dtype)])
    with kernel.use_kernel('loops'): loop = kernel.loops_for(torch.ones(1))['sketch']
    skp = _skp(level)
    for x in vals.numpy():
        counts = np.zeros(2 * k + 1)
        loop(np.array([x]), skp, counts)
        (j,) = np.flatnonzero(counts)
        assert counts[j] == 1 and lo[j] <= x <= hi[j], (x, j, lo[j], hi[j])


def test_nonfinite_values_are_not_bucketed_and_weights_sum_to_the_count():
    "NaN and Inf in sampled batches: the fused sketch's total is the exact finite count, its sampling record the torch ops' one."
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(60_000, generator=g) for _ in range(4)]
    xs[1][::7] = math.nan; xs[2][:100] = math.inf; xs[3][-5:] = -math.inf
    res = {}
    for fused in (True, False):
        r = SketchRecorder()
        with use_kernel('loops' if fused else 'torch'):
            for x in xs: r.record(x)
            r.flush()
        res[fused] = r
    fin = torch.cat(xs)[torch.isfinite(torch.cat(xs))]
    a, b = res[True], res[False]
    assert math.isclose(a.sketch.counts.sum().item(), fin.numel(), rel_tol=1e-12)
    assert torch.allclose(a.sampling, b.sampling, rtol=1e-12, atol=0)
    # the same sampled values in the same buckets, but where a float32 logarithm (the torch ops) rounds an edge value across
    assert (a.sketch.counts - b.sketch.counts).abs().sum() <= 1e-3 * fin.numel()
