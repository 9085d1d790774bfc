"""miniai.compare at the edges: `compare_arrays` against a float64/longdouble reference on random arrays that mix huge,
tiny, subnormal, NaN and Inf values, and `miniai-compare` on broken runs (its exit status is the point): `compare_main` in
this process (the command's code, up to its `sys.exit`), as a command where a process is needed (a FIFO that could block,
a user who cannot write)."""
import math, os, shutil, subprocess, sys, tempfile
from pathlib import Path
from types import SimpleNamespace
import numpy as np, pytest
from hypothesis import given, settings, HealthCheck, strategies as st
from hypothesis.extra import numpy as hnp
from miniai.compare import compare_arrays

ROOT = Path(__file__).parents[2]

def reference(a, b):
    "The statistics `compare_arrays` computes, straight from the definitions, in long double (no overflow for float64 squares)."
    L = np.longdouble
    a, b = a.ravel(), b.ravel()
    fin_a, fin_b = np.isfinite(a), np.isfinite(b)
    both = fin_a & fin_b
    x, y = a[both].astype(L), b[both].astype(L)
    fa, fb = a[fin_a].astype(L), b[fin_b].astype(L)
    sq_a, sq_b = (x*x).sum(), (y*y).sum()
    cos = 1. if sq_a == 0 and sq_b == 0 else 0. if sq_a == 0 or sq_b == 0 else float((x*y).sum()/np.sqrt(sq_a)/np.sqrt(sq_b))
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    return {'cosine similarity': cos if both.any() or a.size == 0 else math.nan,
            'meanA': float(fa.mean()) if fa.size else math.nan, 'stdA': float(fa.std()) if fa.size else math.nan,
            'varA': float(fa.var()) if fa.size else math.nan, 'stdB': float(fb.std()) if fb.size else math.nan,
            'max_abs_err': float(np.abs(x - y).max()) if x.size else (0. if a.size == 0 else math.nan),
            'max_rel_err': (float(np.abs(x - y).max()/np.abs(x).max()) if x.size and np.abs(x).max() > 0 else
                            0. if not x.size or not np.abs(x - y).max() else math.inf) if x.size or a.size == 0 else math.nan,
            'nan_A': int(np.isnan(a).sum()), 'inf_A': int(inf_a.sum()), 'nan_B': int(np.isnan(b).sum()), 'inf_B': int(inf_b.sum()),
            'nan_pos_mismatch': int((np.isnan(a) != np.isnan(b)).sum()),
            'inf_pos_mismatch': int(((inf_a | inf_b) & ~(inf_a & (a == b))).sum()), 'n_finite_both': int(both.sum())}, (fa, fb, x, y)

def close(got, want, tol):
    if math.isnan(want): return math.isnan(got)
    if math.isinf(want): return got == want
    return abs(got - want) <= tol

special = st.sampled_from([0., -0., 1e-45, 5e-324, 2.2e-308, 1e-300, 1e300, 1.7e308, -1.7e308, 3.4e38, math.nan, math.inf, -math.inf])
def values(dtype):
    finite = st.floats(allow_nan=False, allow_infinity=False, width=32 if dtype == np.float32 else 64)
    return st.one_of(finite, special, st.floats(-2, 2, width=32))

def scaled_copy(a, s):
    with np.errstate(all='ignore'): return (a*a.dtype.type(s)).astype(a.dtype)

@st.composite
def array_pairs(draw):
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    n = draw(st.integers(0, 300))
    with np.errstate(all='ignore'): a = draw(hnp.arrays(dtype, n, elements=values(dtype)))
    b = draw(st.one_of(hnp.arrays(dtype, n, elements=values(dtype)),   # unrelated
                       st.just(a.copy()),                               # identical
                       st.builds(lambda s: scaled_copy(a, s), st.sampled_from([0.5, 1.0000001, -1, 2.]))))
    return a, b, draw(st.integers(1, 400))

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(array_pairs())
def test_compare_arrays_matches_reference(pair):
    a, b, chunk = pair
    with np.errstate(all='ignore'):
        got = compare_arrays(a, b, chunk_size=chunk)
        want, (fa, fb, x, y) = reference(a, b)
    n = max(a.size, 1)
    eps = n*2.**-50   # float64 sums of n terms: relative error below n*2^-53, with room
    for k in ['nan_A', 'inf_A', 'nan_B', 'inf_B', 'nan_pos_mismatch', 'inf_pos_mismatch', 'n_finite_both']:
        assert got[k] == want[k], (k, got[k], want[k])   # counts are exact
    assert got['n_elements'] == a.size
    assert close(got['cosine similarity'], want['cosine similarity'], 4*eps), (got['cosine similarity'], want['cosine similarity'])
    scale_a = float(np.abs(fa).max()) if fa.size else 0.
    scale_b = float(np.abs(fb).max()) if fb.size else 0.
    assert close(got['meanA'], want['meanA'], eps*scale_a), (got['meanA'], want['meanA'])
    assert close(got['stdA'], want['stdA'], 4*eps*scale_a), (got['stdA'], want['stdA'])
    assert close(got['stdB'], want['stdB'], 4*eps*scale_b), (got['stdB'], want['stdB'])
    if math.isfinite(want['varA']) and want['varA'] < 1e300: assert close(got['varA'], want['varA'], 8*eps*scale_a*scale_a)
    err_scale = float(np.abs(x - y).max()) if x.size else 0.
    assert close(got['max_abs_err'], want['max_abs_err'], 2.**-52*err_scale), (got['max_abs_err'], want['max_abs_err'])
    assert close(got['max_rel_err'], want['max_rel_err'], 2.**-50*abs(want['max_rel_err'])), (got['max_rel_err'], want['max_rel_err'])

@settings(max_examples=50, deadline=None)
@given(array_pairs(), st.integers(1, 50))
def test_chunking_changes_nothing_exact(pair, chunk2):
    "Counts and the max error do not depend on the chunk size at all; the rest within rounding."
    a, b, chunk = pair
    with np.errstate(all='ignore'): r1, r2 = compare_arrays(a, b, chunk), compare_arrays(a, b, chunk2)
    for k in ['nan_A', 'inf_A', 'nan_B', 'inf_B', 'nan_pos_mismatch', 'inf_pos_mismatch', 'n_finite_both', 'max_abs_err']:
        assert r1[k] == r2[k] or (math.isnan(r1[k]) and math.isnan(r2[k])), k

# --- the command -----------------------------------------------------------------------------------------------------

def cli(*args, timeout=60):
    "`miniai-compare` as a command: the exit status, stdout and stderr (bytes) of its process."
    env = {**os.environ, 'PYTHONPATH': f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, '-m', 'miniai.compare', '--no-progress', *map(str, args)],
                          capture_output=True, timeout=timeout, env=env)

@pytest.fixture
def compare(capsys):
    "`compare_main(args)` in this process, reported as a command's run: the exit status, stdout and stderr (text)."
    from miniai.compare import compare_main
    def run(*args, progress=False):
        try: code = compare_main([*([] if progress else ['--no-progress']), *map(str, args)])
        except SystemExit as e: code = e.code
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)
    return run

def runs(tmp_path, a, b, name='t.npy'):
    for run, arr in [('A', a), ('B', b)]:
        folder = tmp_path/run/'tensors'/'rank_0'
        folder.mkdir(parents=True)
        if arr is not None: np.save(folder/name, arr)
    return tmp_path/'A', tmp_path/'B'

GOOD = np.linspace(1, 2, 1000, dtype='f4')

def test_nan_in_b_fails_even_with_thresholds_met(tmp_path, compare):
    "Half of B is NaN and the finite half equals A: the NaN positions fail the gate, whatever the thresholds say. (The command itself, in a process: its exit status.)"
    broken = GOOD.copy(); broken[:500] = np.nan
    A, B = runs(tmp_path, GOOD, broken)
    res = cli('--pathA', A, '--pathB', B, '--min-cosine', '0.9999', '--max-abs-err', '0')
    out = res.stdout.decode()
    assert res.returncode == 1, out
    assert 'FAIL tensors/rank_0/t.npy: NaN at 500 position(s) in one run only' in out
    assert b'Traceback' not in res.stderr
    assert compare('--pathA', A, '--pathB', B, '--allow-nonfinite-mismatch').returncode == 0

def test_b_lacks_every_tensor(tmp_path, compare):
    A, B = runs(tmp_path, GOOD, None)
    res = compare('--pathA', A, '--pathB', B)
    assert res.returncode == 1 and 't.npy: only in A' in res.stdout, res.stdout
    assert (A/'tensors'/'compare_rst'/'rank_0_uncompared.csv').read_text() == 'tensor_name,reason\nt.npy,only in A\n'

def test_nothing_compared(tmp_path, compare):
    (tmp_path/'A').mkdir(); (tmp_path/'B').mkdir()
    res = compare('--pathA', tmp_path/'A', '--pathB', tmp_path/'B')
    assert res.returncode == 1 and 'nothing was compared' in res.stdout, res.stdout

def test_error_rows_fail_without_thresholds(tmp_path, compare):
    A, B = runs(tmp_path, GOOD, GOOD)
    (B/'tensors'/'rank_0'/'t.npy').write_bytes((A/'tensors'/'rank_0'/'t.npy').read_bytes()[:500])   # truncated
    res = compare('--pathA', A, '--pathB', B)
    assert res.returncode == 1 and 'truncated' in res.stdout, res.stdout

def test_identical_runs_pass(tmp_path, compare):
    A, B = runs(tmp_path, GOOD, GOOD)
    res = compare('--pathA', A, '--pathB', B, '--min-cosine', '1', '--max-abs-err', '0')
    assert res.returncode == 0 and 'all 1 pairs compared and passed' in res.stdout, res.stdout + res.stderr

def test_fifo_does_not_hang_and_symlink_is_not_followed(tmp_path):
    A, B = runs(tmp_path, GOOD, GOOD)
    np.save(A/'tensors'/'rank_0'/'fifo.npy', GOOD); os.mkfifo(B/'tensors'/'rank_0'/'fifo.npy')
    secret = tmp_path/'outside.npy'; np.save(secret, GOOD)
    np.save(A/'tensors'/'rank_0'/'link.npy', GOOD); (B/'tensors'/'rank_0'/'link.npy').symlink_to(secret)
    res = cli('--pathA', A, '--pathB', B, timeout=30)   # np.load on the FIFO would block forever
    out = res.stdout.decode()
    assert res.returncode == 1, out
    assert 'fifo.npy: ERROR: B: a FIFO, not read' in out and 'link.npy: ERROR: B: a symlink, not read' in out, out

def test_non_utf8_name(tmp_path, compare):
    A, B = runs(tmp_path, GOOD, GOOD)
    def save(run, name):
        with open(os.path.join(os.fsencode(run/'tensors'/'rank_0'), name), 'wb') as f: np.save(f, GOOD)
    save(A, b'\xff\xfe.npy'); save(B, b'\xff\xfe.npy'); save(A, b'only\xff.npy')
    res = compare('--pathA', A, '--pathB', B)
    assert res.returncode == 1 and 'Traceback' not in res.stderr, res.stderr
    assert 'only\\xff.npy: only in A' in res.stdout, res.stdout
    assert '\\xff\\xfe.npy,1.0' in (A/'tensors'/'compare_rst'/'rank_0_rst.csv').read_text()

def test_symlinked_compare_rst_is_refused(tmp_path, compare):
    A, B = runs(tmp_path, GOOD, GOOD)
    target = tmp_path/'elsewhere'; target.mkdir()
    (A/'tensors'/'compare_rst').symlink_to(target)
    res = compare('--pathA', A, '--pathB', B)
    assert res.returncode == 2 and 'cannot write the CSVs' in res.stderr and 'Traceback' not in res.stderr, res.stderr
    assert list(target.iterdir()) == []

@pytest.mark.skipif(os.name != 'posix' or not Path('/usr/bin/setpriv').exists(), reason='needs setpriv to drop root')
def test_read_only_path_a():
    "A pathA the user cannot write to: a usage error before comparing (run as `nobody` when we are root, since root writes anywhere)."
    base = Path(tempfile.mkdtemp(dir='/tmp')); base.chmod(0o755)   # where `nobody` can reach it (pytest's folders are root's alone); removed below
    try:
        A, B = runs(base, GOOD, GOOD)
        (A/'tensors').chmod(0o555)
        cmd = [sys.executable, '-m', 'miniai.compare', '--no-progress', '--pathA', str(A), '--pathB', str(B)]
        if os.geteuid() == 0: cmd = ['/usr/bin/setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', *cmd]
        res = subprocess.run(cmd, capture_output=True, timeout=60, cwd=base, env={**{k: v for k, v in os.environ.items() if not k.endswith('_CACHE_DIR')}, 'PYTHONPATH': str(ROOT), 'HOME': str(base), 'TMPDIR': str(base)})   # nobody cannot reach pytest's folders (torch puts its cache folder, under them, in the environment)
        if b'usage: miniai-compare' not in res.stderr and res.returncode != 1: pytest.skip(f'cannot run as nobody here: {res.stderr[-300:]!r}')
        assert res.returncode == 2 and b'cannot write the CSVs' in res.stderr and b'Traceback' not in res.stderr, res.stderr
        assert not (A/'tensors'/'compare_rst').exists()
    finally: shutil.rmtree(base)

@pytest.mark.parametrize('args', [['--min-cosine', 'nan'], ['--min-cosine', '-0.5'], ['--max-abs-err', '-1'], ['--max-abs-err', 'nan']])
def test_bad_thresholds(tmp_path, args, compare):
    A, B = runs(tmp_path, GOOD, GOOD)
    res = compare('--pathA', A, '--pathB', B, *args, progress=True)
    assert res.returncode == 2 and 'usage: miniai-compare' in res.stderr and 'Traceback' not in res.stderr, res.stderr
    assert not (A/'tensors'/'compare_rst').exists()   # nothing compared, nothing written

# --- the moments come from the kernel (`batch_moments` per chunk, folded with `Moments.fold`): structured inputs ---
from miniai.kernel import use_kernel

def np_stats(arr):
    "numpy float64 mean, std, var (ddof=0) of the finite values, centred on the first one and scaled by a power of two (both exact), and their largest magnitude."
    f = arr.astype(np.float64).ravel(); f = f[np.isfinite(f)]
    c = f - f[0]
    top = np.abs(c).max()
    k = 2. ** -np.frexp(top)[1] if top > 0 else 1.
    with np.errstate(over='ignore'): return f[0] + (c*k).mean()/k, (c*k).std()/k, (c*k).var()/k/k, float(np.abs(f).max())

def structured():
    g = np.random.default_rng(7)
    col = g.standard_normal((500, 9)).astype(np.float32); col[:, 4] = np.nan
    every = g.standard_normal(5000); every[::5] = np.nan; every[2::11] = np.inf; every[3::13] = -np.inf
    every32 = g.standard_normal(5000).astype(np.float32); every32[::3] = np.nan
    return {'nan column': col, 'nan every kth f64': every, 'nan every 3rd f32': every32,
            'constant large f64': np.full(3000, 12345.678e280), 'constant large f32': np.full(3000, -12345.678e30, np.float32),
            'large mean small spread': 1e12 + 1e-2 * g.standard_normal(20000),
            'large mean f32': (1e4 + 1e-3 * g.standard_normal(5000)).astype(np.float32),
            'beyond float32': 1e250 * g.standard_normal(5000), 'tiny f64': 1e-250 * g.standard_normal(5000),
            'int64 large offset': (10**15 + g.integers(-1000, 1000, 5000)).astype(np.int64)}

STRUCTURED = structured()

@pytest.mark.parametrize('chunk', [1 << 19, 997, 64])
@pytest.mark.parametrize('fused', [True, False], ids=['fused', 'torch'])
@pytest.mark.parametrize('name', list(STRUCTURED))
def test_structured_inputs_match_numpy(name, fused, chunk):
    a = STRUCTURED[name]
    b = a[::-1].copy()                                   # the same values in another order: the same statistics
    with use_kernel('loops' if fused else 'torch'), np.errstate(all='ignore'): r = compare_arrays(a, b, chunk_size=chunk)
    mean, std, var, top = np_stats(a)
    for side in 'AB':
        assert r[f'nan_{side}'] == int(np.isnan(a.astype(np.float64)).sum()), side
        assert r[f'inf_{side}'] == int(np.isinf(a.astype(np.float64)).sum()), side
        assert abs(r[f'mean{side}'] - mean) <= 1e-15 * top, (side, r[f'mean{side}'], mean)
        if name.startswith('constant'): assert r[f'std{side}'] == 0 and r[f'var{side}'] == 0
        else: assert abs(r[f'std{side}'] / std - 1) <= 1e-10, (side, r[f'std{side}'], std)
        if math.isinf(var): assert r[f'var{side}'] == math.inf   # beyond float64: the std is not
        elif var: assert abs(r[f'var{side}'] / var - 1) <= 2e-10, (side, r[f'var{side}'], var)
    assert r['n_finite_both'] == int((np.isfinite(a.astype(np.float64)) & np.isfinite(b.astype(np.float64))).sum())

def test_all_nonfinite_and_empty():
    a = np.array([np.nan, np.inf, -np.inf, np.nan])
    r = compare_arrays(a, a, chunk_size=3)
    assert (r['nan_A'], r['inf_A'], r['n_finite_both']) == (2, 2, 0)
    assert all(math.isnan(r[k]) for k in ('meanA', 'stdA', 'varA', 'meanA - meanB'))
    r = compare_arrays(np.zeros(0, np.float32), np.zeros(0, np.float32))
    assert r['nan_A'] == r['inf_A'] == r['n_elements'] == 0 and math.isnan(r['meanA'])

def test_threads_at_first_use_keep_the_compiled_kernel(tmp_path):
    "`miniai-compare` compares files in threads: the kernel compiles its loops once, so they stay on (no warning, still fused)."
    for run in 'AB':
        folder = tmp_path/run/'tensors'/'rank_0'; folder.mkdir(parents=True)
        for i in range(8): np.save(folder/f't{i}.npy', np.linspace(0, 1, 5000) * (i + 1))
    code = ("import sys, warnings; warnings.simplefilter('error')\n"
            "import miniai.kernel as K\n"
            "from miniai.compare import compare_dumps\n"
            "res = compare_dumps(sys.argv[1], sys.argv[2], kinds=('tensors',), workers=4, progress=False, verbose=False)\n"
            "print(len(res[('tensors', 0)]['compared']), K.chosen_kernel() is None)")
    out = subprocess.run([sys.executable, '-c', code, str(tmp_path/'A'), str(tmp_path/'B')], capture_output=True, text=True, timeout=300,
                         env={**os.environ, 'PYTHONPATH': str(ROOT)})
    assert out.returncode == 0 and out.stdout.split() == ['8', 'True'], out.stdout + out.stderr
