"""The kernel keeps no process-wide state on its hot path: no buffers per thread, a bounded set of sample tables, the choice of
kernel per thread (`use_kernel`) and read from MINIAI_KERNEL when used (MINIAI_FUSED and `fused_kernel` still work, deprecated);
the torch path (what a GPU runs) records a batch in at most 30 torch ops with no host sync."""
import threading, gc, warnings
import pytest, torch
import miniai.kernel as K, miniai.passes as P
from miniai.kernel import Recorder, use_kernel, fused_kernel, batch_moments, FIELDS, loops_for, sample_table
from miniai.testing import count_ops, count_syncs

def _act(seed=0, shape=(64, 8, 14, 14)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).relu() * 3

@pytest.mark.parametrize('kind', ['per batch', 'run-wide'])
def test_the_torch_path_records_a_batch_in_few_ops_without_syncs(kind):
    "ActivationStats' recorder (moments, dead/overflow counts, sampled histogram) and the run-wide one (zeros, min/max, folded)."
    r = Recorder(minmax=False) if kind == 'per batch' else Recorder(fold=True, zeros=True)
    x = _act()
    with use_kernel('torch'):
        r.record(x)                                     # the first call makes the recorder's constants and sample index
        with count_ops() as co, count_syncs() as cs:
            for _ in range(5): r.record(x)
    assert cs.n == 0, cs.ops
    assert co.n <= 5 * 30, (co.n / 5, co.ops[:co.n // 5])
    with use_kernel('loops'): f = Recorder(minmax=False) if kind == 'per batch' else Recorder(fold=True, zeros=True); f.record(x)
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
    "Tensors held by the kernel's modules' own containers (dicts and lists), besides the bounded table cache (a dict of tables, not of tensors)."
    found = 0
    for mod in (K, P):
        for v in vars(mod).values():
            if not isinstance(v, (dict, list)): continue
            vals = v.values() if isinstance(v, dict) else v
            found += sum(isinstance(t, torch.Tensor) for t in vals)
    return found

def test_short_lived_threads_leave_nothing_behind():
    "40 threads, each recording a few batches on both paths, then gone: the module holds no buffer of theirs."
    before = _module_tensors()
    def work(i):
        for kernel in ('loops', 'torch'):
            with use_kernel(kernel):
                r = Recorder(); r.record(_act(i, (8, 8, 30, 30)).to(memory_format=torch.channels_last)); r.record(torch.randn(500))
                batch_moments(torch.randn(3, 5).t())
    ths = [threading.Thread(target=work, args=(i,)) for i in range(40)]
    for t in ths: t.start()
    for t in ths: t.join()
    gc.collect()
    assert _module_tensors() == before

def test_sample_tables_stay_bounded_over_many_sequence_lengths():
    "The kernel keeps the last few sample tables drawn: the latest comes back as it was, the first of 300 lengths has gone."
    lengths = range(2000, 2000 + 300 * 7, 7)
    first = sample_table(lengths[0], 1024, 'cpu', 16)
    r = Recorder(sample=1024)
    for n in lengths: r.record(torch.randn(n))
    assert len(r) == 300 and r.hists.shape == (300, 41)
    assert sample_table(lengths[-1], 1024, 'cpu', 16) is sample_table(lengths[-1], 1024, 'cpu', 16)
    assert sample_table(lengths[0], 1024, 'cpu', 16) is not first

def test_use_kernel_switches_only_its_own_thread():
    x = torch.randn(1000)
    inside, release, seen = threading.Event(), threading.Event(), {}
    def other():
        with use_kernel('torch'):
            seen['other'] = K.loops_for(x) is None
            inside.set(); release.wait(30)
    t = threading.Thread(target=other); t.start()
    assert inside.wait(30)
    with use_kernel('loops'): seen['main'] = loops_for(x) is not None   # waits for the loops if need be
    release.set(); t.join()
    assert seen == {'other': True, 'main': True}

def test_the_environment_variable_is_read_when_used(monkeypatch):
    x = torch.randn(100)
    monkeypatch.delenv('MINIAI_FUSED', raising=False)
    with use_kernel('loops'): assert loops_for(x) is not None
    monkeypatch.setenv('MINIAI_KERNEL', 'torch')
    assert loops_for(x) is None
    with use_kernel('loops'): assert loops_for(x) is not None       # the thread's block wins over the environment
    monkeypatch.setenv('MINIAI_KERNEL', 'loops')
    assert loops_for(x) is not None and loops_for(x.cuda() if torch.cuda.is_available() else x.half()) is None   # what the loops do not serve
    monkeypatch.delenv('MINIAI_KERNEL')
    assert loops_for(x) is not None

def test_the_older_switches_still_work_with_a_deprecation_warning(monkeypatch):
    x = torch.randn(100)
    monkeypatch.delenv('MINIAI_KERNEL', raising=False)
    with pytest.warns(DeprecationWarning, match="use_kernel"):
        with fused_kernel(False): assert loops_for(x) is None
    P.reset_kernel()                                                 # notes are given once per process: give them again
    monkeypatch.setenv('MINIAI_FUSED', '0')
    with pytest.warns(DeprecationWarning, match='MINIAI_KERNEL'): assert loops_for(x) is None
    monkeypatch.setenv('MINIAI_FUSED', '1')
    assert loops_for(x) is not None
    monkeypatch.setenv('MINIAI_KERNEL', 'nonsense')
    with pytest.warns(UserWarning, match="not one of loops, torch, triton"): assert loops_for(x) is not None   # the default, with a note
    with pytest.raises(ValueError, match="must be one of"): use_kernel('numba').__enter__()

def test_reset_kernel_forgets_the_loops_and_tables_and_gets_them_ready_again():
    x = torch.randn(20_000)
    r = Recorder(); r.record(x)
    tab = sample_table(x.numel(), 16384, 'cpu', 16)
    K.reset_kernel()
    assert sample_table(x.numel(), 16384, 'cpu', 16) is not tab
    r.record(x)                                    # the loops again, loaded from numba's cache at once
    assert K.loops_ready() and len(r) == 2 and torch.equal(r.moments.t[0].nan_to_num(), r.moments.t[1].nan_to_num())

def test_the_triton_switch_dispatches_to_the_triton_kernel_in_its_interpreter(tmp_path):
    "`MINIAI_KERNEL=triton` with `TRITON_INTERPRET=1` (a fresh process: Triton reads it at its import): `Recorder`, `batch_moments` and a folded recorder run the Triton kernel (two launches a call) on CPU tensors, with the loops' counts, min and max and their moments within 1e-12; the histogram bins every value."
    import os, subprocess, sys, json
    from pathlib import Path
    code = """
import json, math, torch
import miniai.kernel as K
from miniai.triton_kernel import count_launches
g = torch.Generator().manual_seed(0)
xs = [torch.randn(4, 8, 20, 20, generator=g) * 3 + 1 for _ in range(3)]
xs[1][0, 0, 0, :3] = torch.tensor([math.nan, math.inf, 0.]); xs.append(xs[0].to(memory_format=torch.channels_last)); xs.append(xs[2].transpose(1, 3).double())
def run():
    r, f = K.Recorder(), K.Recorder(fold=True, zeros=True)
    for x in xs: r.record(x); f.record(x)
    return r, f, K.batch_moments(xs[3])
with count_launches() as c: tr, tf, tb = run()
with K.use_kernel('loops'): lr, lf, lb = run()
exact = [K.FIELDS.index(k) for k in ('count', 'nan', 'posinf', 'neginf', 'zeros', 'low', 'high', 'min', 'max')]
def agree(a, b): return torch.equal(a[..., exact].nan_to_num(), b[..., exact].nan_to_num()) and torch.allclose(a, b, rtol=1e-12, equal_nan=True)
every = torch.stack([torch.bincount(torch.clamp(x.double()[x.isfinite()].abs() * 4, max=40).long(), minlength=41) for x in xs])   # the finite values
print(json.dumps([c.n, agree(tr.moments.t, lr.moments.t), agree(tf.total.t, lf.total.t), agree(tb.t, lb.t), torch.equal(tr.hists, every.float())]))
"""
    env = {**os.environ, 'TRITON_INTERPRET': '1', 'MINIAI_KERNEL': 'triton', 'PYTHONPATH': str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    if out.returncode and 'triton' in out.stderr and 'ModuleNotFoundError' in out.stderr: pytest.skip('no Triton in this torch')
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().split('\n')[-1]) == [2 * (2 * 5 + 1), True, True, True, True]

def test_triton_asked_for_where_it_cannot_run_notes_it_and_the_torch_ops_record():
    "A CPU tensor without Triton's interpreter (this process): `use_kernel('triton')` records with the torch ops, after one note."
    K.reset_kernel()                                 # notes are given once per process: give it again
    x = torch.randn(1000)
    with use_kernel('torch'): ref = batch_moments(x).t
    try:
        from miniai.triton_kernel import triton_serves
        if triton_serves(x): pytest.skip("Triton's interpreter is on in this process")
    except ImportError: pass
    with use_kernel('triton'):
        with pytest.warns(UserWarning, match='cannot compute the statistics of cpu tensors here'): got = batch_moments(x).t
    assert torch.equal(got.nan_to_num(), ref.nan_to_num())
