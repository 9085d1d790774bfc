"""ActivationStats with every option on, under DDP and FSDP2 (`fully_shard`) in a hand-written loop on two CPU ranks (gloo):
training runs, and after `all_reduce()` every rank holds what one process records on the same batches whole."""
import sys, numpy as np
from pathlib import Path
from _torchrun import run_two_ranks
from miniai.kernel import FIELDS

HERE = Path(__file__).parents[1]/'support'   # the scripts torchrun runs
sys.path.insert(0, str(HERE))
import _fsdp_stats

COUNTS = [FIELDS.index(k) for k in ('count', 'nan', 'posinf', 'neginf', 'low', 'high')]

def test_ddp_and_fsdp2_merge_to_one_process(tmp_path):
    res = run_two_ranks(HERE/'_fsdp_stats.py', tmp_path, 'ddp', 'fsdp', timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    _fsdp_stats.run('single', tmp_path)
    single = np.load(tmp_path/'stats_single_rank0.npz')
    keys = sorted(single.files)
    kinds = {k.split('|')[2] for k in keys}
    assert {'output', 'output_grad', 'param[weight]', 'param[bias]', 'param_grad[weight]', 'param_grad[bias]'} <= kinds
    assert {k.split('|')[1] for k in keys} == {'0', '2', '4'}
    for mode in ('ddp', 'fsdp'):
        for r in (0, 1):
            got = np.load(tmp_path/f'stats_{mode}_rank{r}.npz')
            assert sorted(got.files) == keys, (mode, r)
            for k in keys:
                a, b = got[k], single[k]
                assert a.shape == b.shape, (mode, r, k)
                if k.split('|')[2] == 'output_grad':
                    # each rank's loss is the mean over its half of the batch: the gradients of the layers' outputs are
                    # world_size (2) times one process's (DDP and FSDP average the parameters' gradients, not these)
                    if k.endswith('moms'):
                        np.testing.assert_array_equal(a[:, COUNTS[0]], b[:, COUNTS[0]])
                        np.testing.assert_allclose(a[:, FIELDS.index('m2')], 4 * b[:, FIELDS.index('m2')], rtol=1e-9)   # the spread, twice the std
                    continue
                if k.endswith('hists'): np.testing.assert_array_equal(a, b, err_msg=f'{mode} rank{r} {k}')
                else:
                    np.testing.assert_array_equal(a[:, COUNTS], b[:, COUNTS], err_msg=f'{mode} rank{r} {k}')   # counts exact
                    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-15, err_msg=f'{mode} rank{r} {k}')      # moments to rounding
