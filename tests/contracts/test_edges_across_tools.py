"""Trust at the edges: folders used twice, files that are not files, runs that end early, bad arguments."""
import contextlib, io, json, os, sys
from pathlib import Path
import numpy as np, pytest, torch
from torch import nn

def _gate(a, b, *flags):
    from miniai.compare import compare_main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try: compare_main(['--pathA', str(a), '--pathB', str(b), '--no-progress', *flags]); code = None
        except SystemExit as e: code = e.code
    return code, out.getvalue()

def _run(path, steps, **kw):
    from miniai.dumps import register_saving_hook
    torch.manual_seed(0)
    model = register_saving_hook(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), path, 'Linear', -1, -1, **kw)
    for _ in range(steps): model(torch.randn(8, 4)).sum().backward()
    model.saving_hook.remove()
    return sorted(p.name for p in (Path(path)/'tensors'/'rank_0').glob('*.npy'))

def test_dump_folder_used_twice(tmp_path):
    first = _run(tmp_path/'d', 5)
    with pytest.raises(FileExistsError, match="if_exists='overwrite'"): _run(tmp_path/'d', 2)
    assert sorted(p.name for p in (tmp_path/'d'/'tensors'/'rank_0').glob('*.npy')) == first   # nothing lost
    assert len(_run(tmp_path/'d', 2, if_exists='overwrite')) == 4                      # emptied first: only the new run's files
    assert len(_run(tmp_path/'d', 3, if_exists='new_run')) == 4                         # untouched: its files went to d/run_0
    assert len(list((tmp_path/'d'/'run_0'/'tensors'/'rank_0').glob('*.npy'))) == 6

def test_two_live_writers_refused(tmp_path):
    from miniai.dumps import register_saving_hook
    a = register_saving_hook(nn.Linear(2, 2), tmp_path, 'Linear')
    with pytest.raises(RuntimeError, match='in use by another SavingHook'): register_saving_hook(nn.Linear(2, 2), tmp_path, 'Linear')
    a.saving_hook.remove()
    register_saving_hook(nn.Linear(2, 2), tmp_path, 'Linear', if_exists='overwrite').saving_hook.remove()   # free once removed

def test_compare_fails_on_unlisted_files(tmp_path):
    _run(tmp_path/'A', 3); _run(tmp_path/'B', 3)
    np.save(tmp_path/'A'/'tensors'/'rank_0'/'tensor_idx_99_layer_class_Linear_layer_name_0_micro_step_9.npy', np.zeros(3, np.float32))
    code, out = _gate(tmp_path/'A', tmp_path/'B', '--allow-missing')
    assert code == 1 and 'not listed in its index.json' in out, out

@pytest.mark.parametrize('kind', ['fifo', 'symlink', 'nested', 'notflat', 'garbage'])
def test_bad_index_json(tmp_path, kind):
    from miniai.compare import dump_index, DumpIndexError
    _run(tmp_path/'A', 1); _run(tmp_path/'B', 1)
    fn = tmp_path/'A'/'tensors'/'rank_0'/'index.json'
    fn.unlink()
    if kind == 'fifo': os.mkfifo(fn)
    elif kind == 'symlink': fn.symlink_to('/dev/zero')
    elif kind == 'nested': fn.write_text('[' * 100_000 + ']' * 100_000)
    elif kind == 'notflat': fn.write_text(json.dumps({'x.npy': {'dtype': {'a': [[1]]}}}))
    else: fn.write_bytes(b'\xff\x00{')
    with pytest.raises(DumpIndexError): dump_index(fn.parent)
    code, out = _gate(tmp_path/'A', tmp_path/'B')
    last = out.strip().splitlines()[-1]   # argparse's usage, then one line
    assert code == 2 and last.startswith('miniai-compare: error:') and 'index.json' in last and 'Traceback' not in out, out

def test_index_dtype_printed_escaped(tmp_path):
    _run(tmp_path/'A', 1); _run(tmp_path/'B', 1)
    fn = tmp_path/'A'/'tensors'/'rank_0'/'index.json'
    index = json.loads(fn.read_text())
    for v in index['files'].values(): v['dtype'] = '\x1b[31mred'
    fn.write_text(json.dumps(index))
    code, out = _gate(tmp_path/'A', tmp_path/'B')
    assert '\x1b' not in out and '\\x1b[31mred' in out, out

def test_compare_empty_path_is_usage_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for args in (('', tmp_path), (tmp_path, '')):
        code, out = _gate(*args)
        assert code == 2 and 'empty string' in out
    assert list(tmp_path.iterdir()) == []   # nothing written to the current folder

class _FakeStats:
    "Draws a one-column image, as a run with one recorded batch does."
    def _draw(self):
        import matplotlib.pyplot as plt
        from miniai.datasets import show_image
        self.fig, ax = plt.subplots(); show_image(np.random.rand(41, 1), ax)
    color_dim = dead_chart = plot_stats = _draw

def test_plots_never_follow_symlinks(tmp_path):
    from miniai.cli import write_plots
    target = tmp_path/'outside.png'; target.write_bytes(b'keep')
    (tmp_path/'out').mkdir(); (tmp_path/'out'/'color_dim.png').symlink_to(target)
    write_plots(_FakeStats(), tmp_path/'out')
    assert target.read_bytes() == b'keep' and not (tmp_path/'out'/'color_dim.png').is_symlink()
    assert all((tmp_path/'out'/f'{n}.png').read_bytes()[:4] == b'\x89PNG' for n in ('color_dim', 'dead_chart', 'plot_stats'))

def test_full_disk_while_drawing_keeps_summary(tmp_path, monkeypatch):
    import errno, miniai.cli as cli
    def full(fn, data, durable=False): raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(cli, 'atomic_write', full)
    with pytest.raises(OSError, match='color_dim.png: No space left on device.*summary.json'): cli.write_plots(_FakeStats(), tmp_path)
    # main: summary.json is written first (write_json, a different writer), then one line and exit 1
    def run(*a, **k):   # as diagnose_run writes: its folder is made only when the results are there
        out = Path(a[3])
        def write(): cli.write_json(out/'summary.json', {'ok': 1}); cli.write_plots(_FakeStats(), out)
        cli._write_out(out, write)
    monkeypatch.setattr(cli, 'diagnose_run', run)
    err = io.StringIO()
    with contextlib.redirect_stderr(err): code = cli.main(['--out', str(tmp_path/'o')])
    assert code == 1 and len(err.getvalue().strip().splitlines()) == 1 and 'No space left' in err.getvalue()
    assert json.loads((tmp_path/'o'/'summary.json').read_text()) == {'ok': 1}

def test_sigint_exits_130_one_line(tmp_path, monkeypatch):
    import miniai.cli as cli
    def interrupted(*a, **k): raise KeyboardInterrupt
    monkeypatch.setattr(cli, 'diagnose_run', interrupted)
    err = io.StringIO()
    with contextlib.redirect_stderr(err): code = cli.main(['--out', str(tmp_path)])
    assert code == 130 and err.getvalue().strip() == 'miniai-diagnose: interrupted'

def test_cache_dir_empty_env_and_no_home(monkeypatch):
    from miniai.datasets import cache_dir
    monkeypatch.setenv('MINIAI_CACHE', '')
    assert cache_dir() == Path.home()/'.cache'/'miniai'
    monkeypatch.setenv('MINIAI_CACHE', '/tmp/mc'); monkeypatch.delenv('HOME', raising=False)
    monkeypatch.setattr(Path, 'home', classmethod(lambda cls: (_ for _ in ()).throw(RuntimeError('Could not determine home directory'))))
    assert cache_dir() == Path('/tmp/mc')

def test_statistics_config_and_state_dict_edges():
    import copy
    from miniai.statistics import StatisticsConfig, StatisticsCollector
    with pytest.raises(ValueError, match='histogram_bins'): StatisticsConfig(histogram_bins=10**9)
    c = StatisticsCollector(StatisticsConfig(collect_percentiles=[99.9, 99.900001], max_samples=0))
    c.update_statistics('fc', None, torch.randn(1000))
    assert set(c.export_statistics()['fc']['output_stats']['percentiles']) == {'99.9', '99.900001'}
    good = c.state_dict(); bad = copy.deepcopy(good)
    bad['streams'][0]['sketch']['count'][0] = -1.
    with pytest.raises(ValueError, match=r'streams\[0\]\.sketch\.count'): c.load_state_dict(bad)
    bad = copy.deepcopy(good); bad['streams'][0]['batches'] = 'x'
    with pytest.raises(ValueError, match=r'streams\[0\]\.batches'): c.load_state_dict(bad)
    assert c.state_dict() == good
