"""miniai-diagnose as a user runs it: real subprocesses (the installed `miniai-diagnose` and `python -m miniai`), real
exit codes, real FashionMNIST; and `main(argv)` in this process for the usage errors, the same code up to the exit.
Usage errors must be one line on stderr, exit code 2, and come before any data is loaded: each usage-error run gets an
empty MINIAI_CACHE, which loading FashionMNIST would fill, and must leave it empty and print nothing on stdout. Runs that
train use the usual cache (building it from the IDX files again for each run would only cost time)."""
import json, os, shutil, subprocess, sys, time
from pathlib import Path
from types import SimpleNamespace
import pytest

exe = [sys.executable, '-m', 'miniai']
SCRIPT = Path(sys.executable).parent/'miniai-diagnose'   # the console script that `pip install` made
script = [str(SCRIPT)] if SCRIPT.exists() else exe

def no_constants(name): raise ValueError(f'summary.json holds {name}, which is not JSON')

def run(args, tmp_path, timeout=600, prefix=(), cmd=exe, empty_cache=True):
    "Run the command with `args` (after `prefix`); with `empty_cache`, MINIAI_CACHE is an empty folder that loading the data would fill."
    env = {**os.environ, 'MINIAI_CACHE': str(tmp_path/'cache')} if empty_cache else dict(os.environ)
    t0 = time.perf_counter()
    res = subprocess.run([*prefix, *cmd, *args], capture_output=True, text=True, timeout=timeout, env=env)
    res.seconds = time.perf_counter() - t0
    return res

def assert_usage_error(res, tmp_path, *words):
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith('miniai-diagnose: error: '), res.stderr   # one line, no traceback
    for w in words: assert w in lines[0], (w, lines[0])
    assert res.stdout == ''                                  # no training output
    assert not (tmp_path/'cache').exists(), 'the data was loaded before the usage error'

def main_here(args, capsys):
    "Run `main(args)` in this process; return what a subprocess would: exit code, stdout, stderr."
    from miniai.cli import main
    try: code = main(list(args))
    except SystemExit as e: code = e.code
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)

def test_diagnose_variant_writes_summary(tmp_path):
    res = run(['--model', 'batchnorm', '--epochs', '1', '--max-batches', '55', '--out', str(tmp_path/'out')], tmp_path, cmd=script, empty_cache=False)
    assert res.returncode == 0, res.stderr[-2000:]
    out = tmp_path/'out'
    summary = json.loads((out/'summary.json').read_text(), parse_constant=no_constants)
    assert summary['model'] == 'batchnorm' and summary['epochs'] == 1
    assert summary['max_batches'] == 55 and summary['world_size'] == 1
    assert summary['accuracy'] > 0.8, summary['accuracy']          # 55 batches of the fixed model already train it (0.821)
    assert not any({'dead', 'vanishing'} & set(r['flags']) for r in summary['layers'])
    for name in ('color_dim.png', 'dead_chart.png', 'plot_stats.png'): assert (out/name).stat().st_size > 10_000
    assert sorted(p.name for p in out.iterdir()) == ['color_dim.png', 'dead_chart.png', 'plot_stats.png', 'summary.json']  # no temp files left
    assert 'test accuracy' in res.stdout

def test_diverging_run_writes_strict_json(tmp_path, capsys):
    "A finite but absurd learning rate trains (it is the user's call) and the diverged statistics are null with a reason. (`main` in this process: the run above is the command's.)"
    res = main_here(['--lr', '1e30', '--epochs', '1', '--max-batches', '8', '--out', str(tmp_path/'out')], capsys)
    assert res.returncode == 0, res.stderr[-2000:]
    text = (tmp_path/'out'/'summary.json').read_text()
    summary = json.loads(text, parse_constant=no_constants)
    assert summary['lr'] == 1e30
    nulls = {(r['layer'], k[:-len('_reason')]): why for r in summary['layers'] for k, why in r.items() if k.endswith('_reason')}
    assert nulls, 'expected some statistics of the diverged run to be null'
    for (layer, k), why in nulls.items():
        row = next(r for r in summary['layers'] if r['layer'] == layer)
        assert row[k] is None and why in ('nan', 'inf', '-inf', 'not recorded'), (layer, k, why)
    # every layer saw NaN/Inf; the first to see it is flagged, the ones after it are marked downstream of it
    layers = [r for r in summary['layers'] if r['layer'] != '']      # '': the model as a whole, when the verdict says it diverged
    assert len(layers) == 5 and all({'nonfinite values', 'no finite values'} & {f['issue'] for f in r['findings']} for r in layers)
    assert all(r['flags'] or r['downstream'] in {l['layer'] for l in layers} for r in layers)
    assert {'nonfinite values', 'no finite values'} & set(layers[0]['flags'])
    assert '±nan' not in res.stdout and '~nan' not in res.stdout   # a layer with no finite values has no estimate to bound

BAD = [
    (['--lr', 'inf'], ['--lr', "'inf'"]), (['--lr', 'nan'], ['--lr']), (['--lr', '-inf'], ['--lr']), (['--lr', '0'], ['--lr']),
    (['--lr', '-1'], ['--lr']), (['--lr', '1e-400'], ['--lr']), (['--lr', 'fast'], ['--lr', 'expected a number']),
    (['--seed', '-1'], ['--seed', "'-1'"]), (['--seed', str(2**32)], ['--seed', '4294967295']), (['--seed', '1.5'], ['--seed']),
    (['--epochs', '0'], ['--epochs', 'at least 1']), (['--epochs', 'two'], ['--epochs']),
    (['--bs', '0'], ['--bs', 'at least 1']), (['--bs', '-5'], ['--bs']),
    (['--model', 'resnet'], ['--model', 'invalid choice']), (['--model'], ['--model']), (['--bogus'], ['--bogus']),
    (['--out', '/proc/miniai-test'], ['--out', '/proc/miniai-test']), (['--out', '/sys/fs'], ['--out', 'Permission denied']),
    (['--out', ''], ['--out', 'must name a folder']),
]

# each subprocess imports torch (seconds), so `python -m miniai` runs one of them, the installed `miniai-diagnose` another
# (test_usage_error_makes_no_folder_as_user)...
def test_usage_errors(tmp_path):
    res = run(['--lr', 'inf'], tmp_path, timeout=120)
    assert_usage_error(res, tmp_path, '--lr', "'inf'")

# ... and `main` in this process runs them all: the same code, up to the exit
@pytest.mark.parametrize('bad,words', BAD, ids=[' '.join(b) or 'empty' for b, _ in BAD])
def test_usage_errors_in_process(bad, words, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv('MINIAI_CACHE', str(tmp_path/'cache'))
    res = main_here(bad, capsys)
    assert_usage_error(res, tmp_path, *words)
    assert not Path('/proc/miniai-test').exists()

def test_out_is_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv('MINIAI_CACHE', str(tmp_path/'cache'))
    f = tmp_path/'summary.txt'; f.write_text('mine')
    assert_usage_error(main_here(['--out', str(f)], capsys), tmp_path, '--out', 'is a file, not a folder')
    assert_usage_error(main_here(['--out', str(f/'sub')], capsys), tmp_path, '--out', 'Not a directory')
    assert f.read_text() == 'mine'

# `main` on each argument list in one process, as `run` reports a command: [exit code, stdout, stderr] per list, in JSON
MAIN_EACH = """import contextlib, io, json, sys
from miniai.cli import main
res = []
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: code = main(args)
        except SystemExit as e: code = e.code
    res.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(res))"""

def test_out_read_only_folder(tmp_path, capsys, monkeypatch):
    """A real read-only folder. As root, permission bits are ignored, so the folder is bind-mounted read-only in a
    private mount namespace (`unshare -m`) around one Python that runs `main` on both cases; otherwise `chmod 555` is enough."""
    ro = tmp_path/'ro'; ro.mkdir()
    if os.geteuid() != 0:
        monkeypatch.setenv('MINIAI_CACHE', str(tmp_path/'cache'))
        ro.chmod(0o555)
        try: res = main_here(['--out', str(ro)], capsys)
        finally: ro.chmod(0o755)
        assert_usage_error(res, tmp_path, '--out', 'Permission denied')
    else:
        if not shutil.which('unshare'): pytest.skip('needs unshare to make a read-only folder as root')
        probe = subprocess.run(['unshare', '-m', 'true'], capture_output=True)
        if probe.returncode: pytest.skip(f'unshare -m not permitted here: {probe.stderr.decode().strip()}')
        mount = f'mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && exec "$@"'
        both = json.dumps([['--out', str(ro)], ['--out', str(ro/'a'/'b')]])
        res = run([], tmp_path, timeout=120, prefix=['unshare', '-m', 'sh', '-c', mount, 'sh'], cmd=[sys.executable, '-c', MAIN_EACH, both])
        assert res.returncode == 0, res.stderr[-2000:]
        for code, out, err in json.loads(res.stdout):
            assert_usage_error(SimpleNamespace(returncode=code, stdout=out, stderr=err), tmp_path, '--out', 'Read-only file system')
    assert list(ro.iterdir()) == []

def test_help_still_works(capsys):
    res = main_here(['--help'], capsys)
    assert res.returncode == 0 and 'usage: miniai-diagnose' in res.stdout and '--lr' in res.stdout

# --- several processes: torchrun with two CPU ranks (gloo) ---
from _torchrun import run_two_ranks

def test_two_ranks_under_torchrun(tmp_path):
    "Both ranks train; rank 0 alone prints and writes; summary and TensorBoard hold the statistics of both ranks' batches."
    out, tb = tmp_path/'out', tmp_path/'tb'
    res = run_two_ranks('-m', 'miniai', '--epochs', '1', '--max-batches', '8', '--out', out, '--tensorboard', tb, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count('test accuracy') == 1 and '(2 processes)' in res.stdout
    summary = json.loads((out/'summary.json').read_text(), parse_constant=no_constants)
    assert summary['world_size'] == 2 and summary['max_batches'] == 8 and 0 < summary['accuracy'] < 1
    names = [r['layer'] for r in summary['layers']]
    assert len(names) == 5 and not any(n.startswith('module') for n in names)   # the user's layer names, not DDP's
    assert sorted(p.name for p in out.iterdir()) == ['color_dim.png', 'dead_chart.png', 'plot_stats.png', 'summary.json']
    events = list(tb.glob('events.out.tfevents.*'))
    assert len(events) == 1, events                                               # rank 0 alone writes
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tb)); ea.Reload()
    for row in summary['layers']:
        means = ea.Scalars(f"activations/{row['layer']}.output/mean")
        assert [e.step for e in means] == list(range(8))                          # 8 merged batches, not 8 per rank
        assert means[-1].value == pytest.approx(row['mean'], rel=1e-6, abs=1e-9)  # diagnose reads the last batch (tail of 8)
        bad = ea.Scalars(f"activations/{row['layer']}.output/nonfinite")
        assert sum(e.value for e in bad) == row['nonfinite']

def test_a_failing_rank_fails_the_run(tmp_path):
    "Rank 1 raises after one batch: the run exits with an error within the time limit, and nothing is written."
    out = tmp_path/'out'
    res = run_two_ranks(Path(__file__).parents[1]/'support'/'_cli_failing_rank.py', '--epochs', '1', '--out', out, timeout=200)
    assert res.returncode != 0
    assert 'rank 1 fails on purpose' in res.stderr, res.stderr[-3000:]
    assert not (out/'summary.json').exists()

# --- a usage error leaves no folder behind ---
NO_FOLDER = [
    (['--tensorboard', '/proc/miniai-tb'], ['--tensorboard', 'cannot write files in']),
    (['--tensorboard', 'tb.txt'], ['--tensorboard', 'is a file, not a folder']),
    (['--tensorboard', 'miniai-diagnosis/summary.json'], ['--tensorboard', 'is where --out writes summary.json']),
    (['--out', 'new/out', '--tensorboard', 'new/out/color_dim.png'], ['--tensorboard', 'color_dim.png']),
    (['--out', 'new/out', '--tensorboard', 'new/tb.txt/sub'], ['--tensorboard', 'Not a directory']),
    (['--out', 'new/out', '--tensorboard', 'new/tb', '--lr', '0'], ['--lr']),
]

@pytest.mark.parametrize('bad,words', NO_FOLDER, ids=[' '.join(b) for b, _ in NO_FOLDER])
def test_usage_error_makes_no_folder(bad, words, capsys, monkeypatch, tmp_path):
    "Every option is checked, together, before any folder is made: the default `miniai-diagnosis` in the current folder included."
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('MINIAI_CACHE', str(tmp_path/'cache'))
    (tmp_path/'tb.txt').write_text('mine')
    (tmp_path/'new').mkdir(); (tmp_path/'new'/'tb.txt').write_text('mine')
    assert_usage_error(main_here(bad, capsys), tmp_path, *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['new', 'tb.txt']
    assert sorted(p.name for p in (tmp_path/'new').iterdir()) == ['tb.txt']

def test_usage_error_makes_no_folder_as_user(tmp_path):
    "The installed command as a user runs it, in an empty folder: `--tensorboard` in /proc is refused (exit code 2) and no ./miniai-diagnosis appears."
    env = {**os.environ, 'MINIAI_CACHE': str(tmp_path/'cache')}
    work = tmp_path/'work'; work.mkdir()
    res = subprocess.run([*script, '--tensorboard', '/proc/miniai-tb'], capture_output=True, text=True, timeout=120, env=env, cwd=work)
    assert_usage_error(res, tmp_path, '--tensorboard', '/proc/miniai-tb')
    assert list(work.iterdir()) == []

def test_missing_tensorboard_package_makes_no_folder(capsys, monkeypatch, tmp_path):
    "`--tensorboard` without the tensorboard package: a usage error naming the package, before the --out folder is made."
    from miniai.cli import diagnose_run, BadArgument
    monkeypatch.setitem(sys.modules, 'tensorboard', None)      # what Python sees when the package is not installed
    monkeypatch.setenv('MINIAI_CACHE', str(tmp_path/'cache'))
    res = main_here(['--out', str(tmp_path/'out'), '--tensorboard', str(tmp_path/'tb')], capsys)
    assert_usage_error(res, tmp_path, '--tensorboard', 'pip install')
    with pytest.raises(BadArgument, match='tensorboard package'): diagnose_run(out=tmp_path/'out', tensorboard=tmp_path/'tb')
    assert list(tmp_path.iterdir()) == []

def test_python_usage_error_makes_no_folder(tmp_path):
    from miniai.cli import diagnose_run, BadArgument
    (tmp_path/'file').write_text('x')
    with pytest.raises(BadArgument, match='tensorboard .* is a file'): diagnose_run(out=tmp_path/'a'/'out', tensorboard=tmp_path/'file')
    with pytest.raises(BadArgument, match='max_batches'): diagnose_run(out=tmp_path/'b'/'out', max_batches=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['file']

def test_failed_write_removes_the_folders_it_made(tmp_path):
    "The out folder is made when the results are written: a write that fails leaves none of the folders it made, and keeps what was there."
    from miniai.cli import _write_out
    def fails(): raise OSError(28, 'No space left on device')
    with pytest.raises(OSError): _write_out(tmp_path/'a'/'b', fails)
    assert list(tmp_path.iterdir()) == []
    (tmp_path/'kept').mkdir()
    with pytest.raises(OSError): _write_out(tmp_path/'kept'/'out', fails)
    assert [p.name for p in tmp_path.iterdir()] == ['kept'] and list((tmp_path/'kept').iterdir()) == []
    def half(): (tmp_path/'c'/'summary.json').write_text('{}'); fails()
    with pytest.raises(OSError): _write_out(tmp_path/'c', half)
    assert (tmp_path/'c'/'summary.json').exists()              # what was written stays
