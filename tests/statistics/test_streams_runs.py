"""The parts split out of statistics and compare: a `Stream` merged from two halves is the stream of the whole, and its state
round-trips; `miniai.runs` holds ActivationStats' save/load/compare, still importable from `miniai.compare` without loading the
training stack at `import miniai.compare`."""
import subprocess, sys, types
import torch
from miniai.streams import Stream, check_counts
import pytest

CFG = types.SimpleNamespace(collect_mean=True, collect_std=True, collect_min_max=True, collect_sparsity=True, collect_percentiles=[5, 50, 95],
                            collect_histogram=True, histogram_bins=8, max_samples=4096, exact=False)

def test_two_halves_merge_into_the_whole():
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(300, generator=g) for _ in range(6)]
    a, b, whole = (Stream('cpu', level=0, max_samples=4096, zeros=True) for _ in range(3))
    for x in xs[:3]: a.update(x)
    for x in xs[3:]: b.update(x)
    for x in xs: whole.update(x)
    ra, rw = a.merge(b, max_samples=4096).read(CFG), whole.read(CFG)
    assert (ra.count, ra.min, ra.max, ra.percentiles) == (rw.count, rw.min, rw.max, rw.percentiles)   # exact buffer: numpy's percentiles of the same values
    assert ra.mean == pytest.approx(rw.mean, rel=1e-12) and ra.std == pytest.approx(rw.std, rel=1e-12)
    assert ra.histogram['counts'] == rw.histogram['counts']

def test_a_merge_past_max_samples_drops_the_buffer():
    a, b = Stream('cpu', level=0, max_samples=10), Stream('cpu', level=0, max_samples=10)
    a.update(torch.arange(6.)); b.update(torch.arange(6.))
    a.merge(b, max_samples=10)
    assert a.buf is None and not a.complete and a.read(CFG).percentile_error > 0   # percentiles now come from the sketch

def test_state_round_trips_and_refuses_bad_counts():
    s = Stream('cpu', level=0, max_samples=100, zeros=True)
    s.update(torch.tensor([0., 1., float('nan'), 2.]))
    back = Stream.from_state(s.state(), 0, [''], CFG, True, 'cpu')
    assert back.state() == s.state() and back.read(CFG) == s.read(CFG)
    with pytest.raises(ValueError, match='finite counts >= 0'): check_counts('streams[0]', [1., float('inf')])

def test_compare_still_gives_the_moved_names_and_stays_light():
    import miniai.compare, miniai.runs
    for n in ('save_stats', 'load_stats', 'compare_stats', 'format_comparison', 'plot_compare'):
        assert getattr(miniai.compare, n) is getattr(miniai.runs, n)
    with pytest.raises(AttributeError): miniai.compare.no_such_name
    probe = "import sys, miniai.compare; print(sorted(m for m in ('miniai.runs', 'miniai.activations', 'matplotlib') if m in sys.modules))"
    assert subprocess.run([sys.executable, '-c', probe], capture_output=True, text=True, check=True).stdout.strip() == '[]'
