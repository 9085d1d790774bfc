"""The kernel keeps no process-wide state on its hot path: no buffers per thread, a bounded set of sample tables, the choice of
path per thread (`fused_kernel`) and read from MINIAI_FUSED when used, the compiled loops kept apart from the module's own
functions; the torch path (what a GPU runs) records a batch in at most 30 torch ops with no host sync; a first recording does
not wait for the loops to compile."""
import os, subprocess, sys, threading, types, gc
from pathlib import Path
import pytest, torch
import miniai.kernel as K
from miniai.kernel import Recorder, fused_kernel, batch_moments, FIELDS
from miniai.testing import count_ops, count_syncs

ROOT = Path(__file__).resolve().parents[2]

def _act(seed=0, shape=(64, 8, 14, 14)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).relu() * 3

@pytest.mark.parametrize('kind', ['per batch', 'run-wide'])
def test_the_torch_path_records_a_batch_in_few_ops_without_syncs(kind):
    "ActivationStats' recorder (moments, dead/overflow counts, sampled histogram) and the run-wide one (zeros, min/max, folded)."
    r = Recorder(minmax=False) if kind == 'per batch' else Recorder(fold=True, zeros=True)
    x = _act()
    with fused_kernel(False):
        r.record(x)                                     # the first call makes the recorder's constants and sample index
        with count_ops() as co, count_syncs() as cs:
            for _ in range(5): r.record(x)
    assert cs.n == 0, cs.ops
    assert co.n <= 5 * 30, (co.n / 5, co.ops[:co.n // 5])
    with fused_kernel(True): f = Recorder(minmax=False) if kind == 'per batch' else Recorder(fold=True, zeros=True); f.record(x)
    a, b = (f.moments.t[0], r.moments.t[0]) if kind == 'per batch' else (f.total.t, Moments_first(r))
    counts = [FIELDS.index(k) for k in ('count', 'nan', 'posinf', 'neginf', 'low', 'high')]
    assert torch.equal(a[counts], b[counts]) and torch.allclose(a, b, rtol=1e-12, equal_nan=True)

def Moments_first(r):
    "The Moments row of the first batch a folded recorder recorded (all its batches are the same tensor here)."
    t = r.total.t.clone()
    n = r.n_batches
    for k in ('count', 'nan', 'posinf', 'neginf', 'zeros', 'low', 'high', 'm2'): t[FIELDS.index(k)] /= n
    return t

def _module_tensors():
    "Tensors held by the kernel module's own containers, besides the bounded table cache."
    found = 0
    for name, v in vars(K).items():
        if name == '_TABLES' or not isinstance(v, (dict, list)): continue
        vals = v.values() if isinstance(v, dict) else v
        found += sum(isinstance(t, torch.Tensor) for t in vals)
    return found

def test_short_lived_threads_leave_nothing_behind():
    "40 threads, each recording a few batches on both paths, then gone: the module holds no buffer of theirs."
    before = _module_tensors()
    def work(i):
        for fused in (True, False):
            with fused_kernel(fused):
                r = Recorder(); r.record(_act(i, (8, 8, 30, 30)).to(memory_format=torch.channels_last)); r.record(torch.randn(500))
                batch_moments(torch.randn(3, 5).t())
    ths = [threading.Thread(target=work, args=(i,)) for i in range(40)]
    for t in ths: t.start()
    for t in ths: t.join()
    gc.collect()
    assert _module_tensors() == before
    assert len(K._TABLES) <= K._TABLES_MAX

def test_sample_tables_stay_bounded_over_many_sequence_lengths():
    r = Recorder(sample=1024)
    for n in range(2000, 2000 + 300 * 7, 7): r.record(torch.randn(n))
    assert len(K._TABLES) <= K._TABLES_MAX and len(r._tables) <= 4
    assert len(r) == 300 and r.hists.shape == (300, 41)

def test_fused_kernel_switches_only_its_own_thread():
    x = torch.randn(1000)
    inside, release, seen = threading.Event(), threading.Event(), {}
    def other():
        with fused_kernel(False):
            seen['other'] = K.loops_for(x) is None
            inside.set(); release.wait(30)
    t = threading.Thread(target=other); t.start()
    assert inside.wait(30)
    with fused_kernel(True): seen['main'] = K.loops_for(x) is not None   # waits for the loops to compile if need be
    release.set(); t.join()
    assert seen == {'other': True, 'main': True}

def test_the_environment_variable_is_read_when_used(monkeypatch):
    x = torch.randn(100)
    with fused_kernel(True): assert K.loops_for(x) is not None
    monkeypatch.setenv('MINIAI_FUSED', '0')
    assert K.loops_for(x) is None
    monkeypatch.delenv('MINIAI_FUSED')
    assert K.loops_for(x) is not None

def test_compiling_rebinds_no_module_function():
    before = {n: getattr(K, n) for n in K._LOOP_NAMES}
    with fused_kernel(True): loops = K.loops_for(torch.randn(10))
    assert loops is not None and loops['record'] is not K._record_loop
    assert all(getattr(K, n) is f and isinstance(f, types.FunctionType) for n, f in before.items())

def test_a_first_recording_does_not_wait_for_the_compiler(tmp_path):
    "With an empty numba cache the first recordings run the torch ops while the loops compile in the background."
    code = ("import time, torch\n"
            "import miniai.kernel as K\n"
            "K._FIRST_WAIT = 0.\n"
            "x = torch.randn(64, 8, 14, 14)\n"
            "r = K.Recorder(); r.record(x)\n"
            "ready = 'record' in K._LOOPS\n"
            "with K.fused_kernel(False): t = K.Recorder(); t.record(x)\n"
            "print(ready, torch.equal(r.moments.t.nan_to_num(), t.moments.t.nan_to_num()), K._LOOPS.get('started'))\n")
    env = {**os.environ, 'NUMBA_CACHE_DIR': str(tmp_path), 'PYTHONPATH': str(ROOT)}
    env.pop('MINIAI_FUSED', None)
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.split() == ['False', 'True', 'True'], out.stdout + out.stderr
