"""The kernel's words: `overflow` is the fraction of |x| at or above `hi` (a value *saturates* at an activation's bound, which the
debuggers measure), `merge` combines recorders in one process and `all_reduce_recorders` across ranks. The earlier names still
work, with a DeprecationWarning that names the new one."""
import math, pytest, torch
from torch import nn
from miniai.kernel import Recorder, all_reduce_recorders, sync_recorders

def _conv_outputs(n=3, seed=0):
    "The outputs of a conv with a too-large init (so that some values pass `hi`), one batch of noise images each."
    g = torch.Generator().manual_seed(seed)
    conv = nn.Conv2d(1, 8, 3)
    with torch.no_grad(): conv.weight.normal_(0, 3., generator=g)
    with torch.no_grad(): return [conv(torch.randn(16, 1, 12, 12, generator=g) * (i + 1)) for i in range(n)]

def test_overflow_is_the_fraction_at_or_above_hi_and_saturated_is_its_old_name():
    xs, rec = _conv_outputs(), Recorder()
    for x in xs: rec.record(x)
    want = torch.tensor([(x.abs() >= 10).double().mean().item() for x in xs], dtype=torch.float64)
    assert torch.equal(rec.overflow, want) and (want > 0).all()
    with pytest.warns(DeprecationWarning, match='Recorder.overflow'): old = rec.saturated
    assert torch.equal(old, rec.overflow)

def _halves(xs):
    "Two per-batch recorders that each see half of every batch, and one that sees them whole."
    halves, whole = [Recorder(), Recorder()], Recorder()
    for x in xs:
        whole.record(x)
        for h, part in zip(halves, x.chunk(2)): h.record(part)
    return halves, whole

def test_merge_per_batch_recorders_batch_by_batch():
    halves, whole = _halves(_conv_outputs())
    both = Recorder().merge(*halves)
    assert len(both) == 3 and torch.equal(both.moments.count, whole.moments.count) and torch.equal(both.moments.high, whole.moments.high)
    assert torch.allclose(both.stds, whole.stds, rtol=1e-9) and torch.equal(both.overflow, whole.overflow)
    first = Recorder().merge(halves[0])
    assert first.merge(halves[1]) is first and torch.allclose(first.means, whole.means, rtol=1e-9, atol=1e-12)   # one at a time, in place

def test_combine_is_the_old_name_of_merge():
    halves, _ = _halves(_conv_outputs())
    with pytest.warns(DeprecationWarning, match='merge'): old = Recorder.combine(halves)
    new = Recorder().merge(*halves)
    assert torch.equal(old.moments.t.nan_to_num(), new.moments.t.nan_to_num()) and torch.equal(old.hists, new.hists)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match='non-empty list of Recorders'): Recorder.combine([])

def test_merge_folded_recorders_folds_their_totals():
    xs = _conv_outputs(6)
    parts, whole = [Recorder(fold=True) for _ in range(3)], Recorder(fold=True)
    for i, x in enumerate(xs): parts[i % 3].record(x); whole.record(x)
    merged = parts[0].merge(*parts[1:]).total.to_dict(); ref = whole.total.to_dict()
    assert (merged['count'], merged['high'], merged['min'], merged['max']) == (ref['count'], ref['high'], ref['min'], ref['max'])
    assert math.isclose(merged['std'], ref['std'], rel_tol=1e-9) and len(parts[0]) == 6

def test_merge_refuses_what_does_not_merge_batch_by_batch():
    halves, whole = _halves(_conv_outputs())
    with pytest.raises(ValueError, match='different numbers of batches'): Recorder().merge(whole, Recorder())
    with pytest.raises(ValueError, match='merge it into a folded Recorder'): whole.merge(Recorder(fold=True))
    with pytest.raises(ValueError, match='the same `bins` and `hi`'): Recorder(hi=5.).merge(*halves)
    with pytest.raises(TypeError, match='must be Recorders, got dict'): whole.merge({'rows': 1})
    assert len(whole) == 3      # nothing changed

def test_all_reduce_recorders_outside_distributed_and_its_old_name():
    halves, _ = _halves(_conv_outputs())
    before = [h.moments.t.clone() for h in halves]
    assert all_reduce_recorders(halves) == 0
    with pytest.warns(DeprecationWarning, match='all_reduce_recorders'): assert sync_recorders(halves) == 0
    assert all(torch.equal(h.moments.t.nan_to_num(), b.nan_to_num()) for h, b in zip(halves, before))
