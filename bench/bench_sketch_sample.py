"""The collector's default percentiles on 2^24+ values (64 batches of 2^18+16) of six kinds, against numpy's, with the sketch
fed 16K or 64K sampled values from each batch (`SketchRecorder.sketch_size`), in one run; and the time of one recorder call
(the pass, with the sketch's sample) for both sample sizes. Usage: python bench/bench_sketch_sample.py [draws]"""
import sys, numpy as np, torch
sys.path.insert(0, str(__import__('pathlib').Path(__file__).parent))
from _timing import clock, cpu_name
sys.path.insert(0, str(__import__('pathlib').Path(__file__).parent.parent / 'tests' / 'support'))
from _sketch_families import QS, families   # the inputs the percentiles' test reads
from miniai.statistics import StatisticsCollector, StatisticsConfig
from miniai.sketch import SketchRecorder

def errors(draw):
    "{kind: (largest relative error of p50/p95/p99, whether numpy's lie in the stated intervals)}"
    res = {}
    for name, batches in families(torch.Generator().manual_seed(draw)):
        c = StatisticsCollector(StatisticsConfig(collect_percentiles=QS, collect_input=False))
        for b in batches: c.update_statistics('x', None, b)
        o = c.get_statistics('x').output_stats
        ref = np.percentile(torch.cat(batches).numpy(), QS)
        rel = np.abs(np.array([o.percentiles[q] for q in QS]) - ref) / ref
        res[name] = (rel.max(), all(lo <= r <= hi for r, (lo, hi) in zip(ref, o.percentile_bounds.values())))
    return res

def call_ms(n, reps=200):
    "Best-of-5 milliseconds of one `SketchRecorder.record` call on a tensor of `n` values, after every table row is drawn."
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    r = SketchRecorder()
    for _ in range(64): r.record(x)
    best = []
    for _ in range(5):
        t0 = clock()
        for _ in range(reps): r.record(x)
        best.append((clock() - t0) / reps * 1e3)
    return min(best)

if __name__ == '__main__':
    torch.set_num_threads(1)
    draws = range(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
    size = SketchRecorder.sketch_size
    print(cpu_name())
    for label, f in (('16K a batch', lambda self, n: self.sample), ('64K a batch (default)', size)):
        SketchRecorder.sketch_size = f
        worst, held = {}, True
        for d in draws:
            for k, (e, ok) in errors(d).items(): worst[k] = max(worst.get(k, 0), e); held &= ok
        print(f'{label}: worst relative error over {len(draws)} draws', {k: f'{v:.2%}' for k, v in worst.items()},
              f'overall {max(worst.values()):.2%}, intervals hold: {held}', flush=True)
        print(f'  one call: {call_ms(2**18 + 16):.3f} ms at 2^18+16 values, {call_ms(2**22):.3f} ms at 2^22', flush=True)
    SketchRecorder.sketch_size = size
