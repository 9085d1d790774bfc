"""miniai.compare on integer dumps: compared in integer arithmetic, so 2**53+1 and 2**53 are 1 apart and a
`--max-abs-err 0` gate fails on them; float64 arrays where float64 is exact report the exact difference; a file where a
`tensors` folder should be is named as a file, through `miniai-compare` itself."""
import json, math, os
from pathlib import Path
import numpy as np, pytest
from miniai.compare import compare_arrays, compare_dumps, compare_main, find_failures, read_csv

def _run(root, arr, name='t.npy'):
    d = root/'tensors'/'rank_0'; d.mkdir(parents=True)
    np.save(d/name, arr)
    return root

def _main(*args):
    with pytest.raises(SystemExit) as e: compare_main([str(a) for a in args] + ['--no-progress'])
    return e.value.code

BIG = 2**53
@pytest.mark.parametrize('a, b, err', [
    (np.array([BIG + 1, 3], np.int64), np.array([BIG, 3], np.int64), 1),                      # one apart, equal in float64
    (np.array([2**63 - 1, -2**63], np.int64), np.array([-2**63, 2**63 - 1], np.int64), 2**64 - 1),   # overflows int64
    (np.array([2**64 - 1], np.uint64), np.array([2**64 - 2], np.uint64), 1),
    (np.array([2**64 - 1], np.uint64), np.array([-1], np.int64), 2**64),                      # mixed signedness
    (np.array([0, 255, 7], np.uint8), np.array([255, 0, 7], np.uint8), 255),                  # no uint8 wrap-around
    (np.array([-2**31, 5], np.int32), np.array([2**31 - 1, 5], np.int32), 2**32 - 1),
    (np.array([True, False]), np.array([True, True]), 1),
    (np.arange(10, dtype=np.int64), np.arange(10, dtype=np.int64), 0)])
def test_integers_are_compared_exactly(a, b, err):
    for chunk in (1, 2, 1 << 19):
        r = compare_arrays(a, b, chunk)
        assert type(r['max_abs_err']) is int and r['max_abs_err'] == err
        xa, xb = [int(v) for v in a], [int(v) for v in b]
        assert r['meanA - meanB'] == (sum(xa) - sum(xb))/len(xa)          # the float nearest the exact difference of means
        assert r['meanA'] == sum(xa)/len(xa) and r['meanB'] == sum(xb)/len(xb)
        assert r['max_rel_err'] == (err/max(abs(v) for v in xa) if err else 0.)
        assert (r['sqnr_db'] == math.inf) == (err == 0) and (r['cosine similarity'] == 1.0 if err == 0 else r['cosine similarity'] <= 1.0)

def test_integer_variance_is_exact():
    a = np.array([BIG + 1, BIG + 3, BIG], np.int64)
    r = compare_arrays(a, a - 1)
    n, xs = 3, [BIG + 1, BIG + 3, BIG]
    assert r['varA'] == (n*sum(x*x for x in xs) - sum(xs)**2)/n**2 == 14/9 and r['varA - varB'] == 0.0

def test_float64_where_exact_reports_the_exact_difference():
    a, b = np.array([2.**53, 0.5, -3.], np.float64), np.array([2.**53 + 2, 0.25, -3.], np.float64)
    r = compare_arrays(a, b)
    assert r['max_abs_err'] == 2.0 and r['max_rel_err'] == 2/2.**53 and r['sqnr_db'] < math.inf
    assert compare_arrays(a, a.copy())['max_abs_err'] == 0.0

@pytest.mark.parametrize('dtype', [np.int64, np.int32, np.uint8])
def test_gate_of_zero_fails_on_integer_dumps(tmp_path, dtype, capsys):
    base = np.array([BIG + 1, 7] if dtype == np.int64 else [200, 7], dtype)
    other = base.copy(); other[0] -= 1
    A, B = _run(tmp_path/'A', base), _run(tmp_path/'B', other)
    assert _main('--pathA', A, '--pathB', B, '--max-abs-err', '0') == 1
    assert 'max_abs_err 1 > 0.0' in capsys.readouterr().out
    row, = read_csv(A/'tensors'/'compare_rst'/'rank_0_rst.csv')
    assert row['max_abs_err'] == 1 and type(row['max_abs_err']) is int
    C = _run(tmp_path/'C', base.copy())
    assert _main('--pathA', A, '--pathB', C, '--max-abs-err', '0') == 0
    assert not find_failures(compare_dumps(A, C, progress=False, verbose=False), max_abs_err=0)

def test_tensors_path_that_is_a_file_is_named_as_a_file(tmp_path, capsys):
    A = _run(tmp_path/'A', np.ones(3, 'f4'))
    (tmp_path/'B').mkdir(); (tmp_path/'B'/'tensors').write_text('not a folder')
    assert _main('--pathA', A, '--pathB', tmp_path/'B') == 2
    err = capsys.readouterr().err
    assert f"{tmp_path/'B'/'tensors'} is a regular file, not a folder" in err and 'is not a regular file' not in err

def test_rank_entry_that_is_a_file_is_named_as_a_file(tmp_path, capsys):
    A = _run(tmp_path/'A', np.ones(3, 'f4'))
    (tmp_path/'B'/'tensors').mkdir(parents=True); (tmp_path/'B'/'tensors'/'rank_0').write_text('x')
    assert _main('--pathA', A, '--pathB', tmp_path/'B') == 1
    assert 'ERROR: tensors/rank_0 is a regular file, not read' in capsys.readouterr().out
