"""The collector's default percentiles (a sketch fed a sample of every batch) are within 1% of numpy's on 2^24+ values of
structured inputs, and the stated bound (`percentile_bounds`, `percentile_error`) holds them."""
import numpy as np, torch
from miniai.statistics import StatisticsCollector, StatisticsConfig
from _sketch_families import QS, families as _families

DRAW = 4   # the draw whose heavy tail is the hardest of those tried

def _worst(draw):
    "{kind: the largest relative error of the default percentiles}, after checking that the stated bounds hold."
    worst = {}
    for name, batches in _families(torch.Generator().manual_seed(draw)):
        c = StatisticsCollector(StatisticsConfig(collect_percentiles=QS, collect_input=False))
        for b in batches: c.update_statistics('x', None, b)
        o = c.get_statistics('x').output_stats
        assert o.count == 64 * (2**18 + 16) and 'percentiles' in o.estimated        # sampled, not exact
        ref = np.percentile(torch.cat(batches).numpy(), QS)
        est = np.array([o.percentiles[q] for q in QS])
        rel = np.abs(est - ref) / ref
        for q, r in zip(QS, ref):
            lo, hi = o.percentile_bounds[q]
            assert lo <= r <= hi, (name, q, r, lo, hi)                             # the stated interval holds numpy's
        assert rel.max() <= o.percentile_error, (name, rel, o.percentile_error)    # the stated relative bound holds
        worst[name] = rel.max()
    return worst

def test_default_percentiles_within_one_percent_on_structured_inputs():
    torch.set_num_threads(1)
    worst = _worst(DRAW)
    assert max(worst.values()) < 0.01, worst
