"""A cold start: the compiled loops live in `miniai.loops` (numpy and numba only, `@njit(cache=True)`), compiled once per
install into numba's disk cache. A process whose cache holds them loads them at once; one whose cache is empty records with
the torch ops while a child process compiles them in the background, then records with the loops. Checked in fresh
processes with a cache folder of their own (`NUMBA_CACHE_DIR`)."""
import ast, json, os, subprocess, sys
from pathlib import Path
import pytest, torch

ROOT = Path(__file__).resolve().parents[2]

def _run(code, cache, **env):
    "Run `code` in a fresh process with numba's cache in folder `cache`, outside the repo (this tree's miniai first on the path); its last line of output, as JSON."
    e = {**os.environ, 'NUMBA_CACHE_DIR': str(cache), 'PYTHONPATH': str(ROOT), **env}
    for k in ('MINIAI_KERNEL', 'MINIAI_FUSED'):
        if k not in env: e.pop(k, None)
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=600, env=e, cwd=cache)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().split('\n')[-1])

def _cache_files(cache): return sorted(p.name for p in Path(cache).rglob('*.nbi'))

def test_the_loops_module_imports_only_numpy_and_numba(tmp_path):
    "What the compiling child imports: `miniai.loops` needs neither torch nor the rest of miniai."
    tree = ast.parse((ROOT/'miniai'/'loops.py').read_text())
    mods = {a.name.split('.')[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split('.')[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module}
    assert mods - {'time'} == {'math', 'numpy', 'numba', 'miniai'}, mods       # `miniai`: itself, in `python -m miniai.loops`
    got = _run("import sys, json, miniai.loops; print(json.dumps(sorted(m for m in ('torch', 'miniai.kernel', 'miniai.passes') if m in sys.modules)))", tmp_path)
    assert got == []

def test_a_cold_process_records_with_the_torch_ops_until_the_loops_are_ready_then_loads_them_at_once(tmp_path):
    """An empty cache: the first recordings take the torch ops (the same numbers as `use_kernel('torch')`, bit for bit) while a child
    compiles the loops; once they are ready, the loops record, within the kernel's bound of the torch ops. The torch ops chosen
    (`MINIAI_KERNEL=torch`): nothing is compiled. The cache written: `python -m miniai.loops` and a new process load them at once."""
    code = """
import json, os, time, torch
import miniai.kernel as K
from miniai.activations import ActivationStats
x = torch.randn(64, 8, 14, 14, generator=torch.Generator().manual_seed(0)) * 3 + 1
os.environ['MINIAI_KERNEL'] = 'torch'
ActivationStats(); time.sleep(1)
none_started = not any(f.endswith('.nbi') for _, _, fs in os.walk('.') for f in fs)
del os.environ['MINIAI_KERNEL']
ActivationStats()                      # starts getting the loops ready: an empty cache, so in the background
r = K.Recorder(seed=1); r.record(x)
cold_ready = K.loops_ready()
with K.use_kernel('torch'): t = K.Recorder(seed=1); t.record(x)
same = torch.equal(r.state_dict()['rows'].view(torch.int64), t.state_dict()['rows'].view(torch.int64)) and torch.equal(r.hists, t.hists)
ready = K.loops_ready(None)
w = K.Recorder(seed=1); w.record(x)
a, b = w.moments.t[0], t.moments.t[0]
counts = [K.FIELDS.index(k) for k in ('count', 'nan', 'posinf', 'neginf', 'low', 'high')]
print(json.dumps([none_started, cold_ready, same, ready, torch.equal(a[counts], b[counts]), torch.allclose(a, b, rtol=1e-12, equal_nan=True)]))
"""
    assert _run(code, tmp_path) == [True, False, True, True, True, True]
    assert len(_cache_files(tmp_path)) >= 3           # the child wrote the loops into the cache
    out = subprocess.run([sys.executable, '-m', 'miniai.loops'], capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={**os.environ, 'NUMBA_CACHE_DIR': str(tmp_path), 'PYTHONPATH': str(ROOT)})
    assert out.returncode == 0 and 'loaded from' in out.stdout, out.stdout + out.stderr
    warm = "import json, torch, miniai.kernel as K\nimport miniai.loops as L\nc = L.cached()\nK.Recorder().record(torch.randn(1000))\nprint(json.dumps([c, K.loops_ready()]))"
    assert _run(warm, tmp_path) == [True, True]      # cached: the first recording loaded them, nothing waited in the background

def test_without_numba_the_torch_ops_record(tmp_path):
    "numba missing (here: an import that fails): the torch ops record, silently, and `use_kernel('loops')` does not hang."
    (tmp_path/'numba').mkdir()
    (tmp_path/'numba'/'__init__.py').write_text("raise ModuleNotFoundError('No module named numba', name='numba')\n")
    code = ("import json, warnings, torch\nwarnings.simplefilter('error')\nimport miniai.kernel as K\n"
            "r = K.Recorder(); r.record(torch.randn(1000))\n"
            "with K.use_kernel('loops'): m = K.batch_moments(torch.ones(3))\n"
            "print(json.dumps([K.loops_ready(None), len(r), m.count.item()]))")
    assert _run(code, tmp_path, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}") == [False, 1, 3.]
