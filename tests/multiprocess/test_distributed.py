"""Training beyond one process: two CPU ranks (gloo) under torchrun with DistributedCB."""
import subprocess, sys
import numpy as np
from pathlib import Path
from _torchrun import run_two_ranks, torchrun_env
from miniai.kernel import FIELDS

HERE = Path(__file__).parents[1]/'support'   # the scripts torchrun runs

def test_activation_stats_of_two_ranks_equal_one_process(tmp_path):
    "Each rank sees half of every batch; after fit the merged statistics are those of one process seeing whole batches."
    res = run_two_ranks(HERE/'_ddp_stats.py', 'ddp', tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    one = subprocess.run([sys.executable, str(HERE/'_ddp_stats.py'), 'single', str(tmp_path)], env=torchrun_env(),
                         capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    ddp, single = np.load(tmp_path/'stats_ddp.npz'), np.load(tmp_path/'stats_single.npz')
    assert int(ddp['world_size']) == 2 and int(single['world_size']) == 1
    n_layers = sum(k.startswith('moms') for k in single.files)
    assert n_layers == 5
    for i in range(n_layers):
        assert ddp[f'moms{i}'].shape == single[f'moms{i}'].shape == (8, len(FIELDS))   # 8 batches of 512, a Moments row each
        np.testing.assert_allclose(ddp[f'moms{i}'], single[f'moms{i}'], rtol=1e-12, atol=0)
        counts = [FIELDS.index(k) for k in ('count', 'nan', 'posinf', 'neginf', 'low', 'high')]
        np.testing.assert_array_equal(ddp[f'moms{i}'][:, counts], single[f'moms{i}'][:, counts])   # counts exact
        # (mean, m2, min and max to 1e-12 above: a convolution of 256 items may round the last bit unlike one of 512)
        np.testing.assert_array_equal(ddp[f'hists{i}'], single[f'hists{i}'])
