"""miniai-diagnose as a user runs it: a lesson-11 variant end to end, and bad options."""
import json, subprocess, sys
from pathlib import Path

exe = [sys.executable, '-m', 'miniai']

def test_diagnose_variant_writes_summary(tmp_path):
    res = subprocess.run(exe + ['--model', 'batchnorm', '--epochs', '1', '--out', str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((tmp_path/'summary.json').read_text())
    assert summary['model'] == 'batchnorm' and summary['epochs'] == 1
    assert summary['accuracy'] > 0.8, summary['accuracy']          # one epoch of the fixed model already trains
    assert not any({'dead', 'vanishing'} & set(r['flags']) for r in summary['layers'])
    for name in ('color_dim.png', 'dead_chart.png', 'plot_stats.png'): assert (tmp_path/name).stat().st_size > 10_000
    assert 'test accuracy' in res.stdout

def test_bad_options_exit_2():
    for bad in (['--lr', '-1'], ['--model'], ['--bs', '0']):
        res = subprocess.run(exe + bad, capture_output=True, text=True, timeout=120)
        assert res.returncode == 2 and 'usage: miniai-diagnose' in res.stderr, (bad, res.stderr)
