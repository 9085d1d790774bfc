import os
os.environ.setdefault('MPLBACKEND', 'Agg')
_workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
if _workers > 1:   # one torch thread per xdist worker: two workers x two threads on two cores stall each other (OpenMP spinning)
    os.environ['OMP_NUM_THREADS'] = '1'   # also for the subprocesses the tests start (CLI, torchrun)

import sys, tempfile
from pathlib import Path
import pytest, torch

# tests/support: what several test folders share (models and loops, the torchrun and CLI scripts), importable as `from _steps import ...`
sys.path.insert(0, str(Path(__file__).parent/'support'))
if _workers > 1: torch.set_num_threads(1)

# Property tests: `make test` (and so CI) runs the `make-test` profile, the same examples on every run for a given
# version of the code, so that a run passes or fails on the code alone; `pytest` run directly draws new random examples
# each time, which is how the edge cases found so far were found (run it with `--hypothesis-seed=N` to vary them).
from hypothesis import settings
settings.register_profile('make-test', derandomize=True, database=None)
settings.load_profile(os.environ.get('HYPOTHESIS_PROFILE', 'default'))

# The longest tests first, handed out one at a time (`--maxschedchunk 1` in the Makefile): each worker takes the next
# test when it is free, so that the two workers finish together (xdist's default sends each worker a chunk of
# consecutive tests, which would give the first worker all the slow ones).
_SLOW_FIRST = ['11_initializing', '10f_trainers', '09h_activation_stats', '10_activations', '10h_zoo', '10g_practitioners', '11b_distributed', '10c_debuggers', '10c1_sequential', 'test_diagnose_variant', 'test_distributed',
               'test_diverging_run', 'test_all_reduce_two_ranks', '11a_tensorboard', '10a_statistics', '90_cli', 'test_two_ranks_dump_and_compare',
               'test_two_ranks_under_torchrun', '13_resnet', '14_augment', 'test_a_failing_rank', 'test_two_processes_build_at_once',
               '12_accel_sgd', '10e_monitoring', '10d_compare', '10b_dumps', 'test_new_run_processes', 'test_course_lesson11',
               'test_course_lesson10', 'test_trainers', 'test_compile', 'test_all_reduce_refuses', 'test_cli', 'index', '09_learner']

def pytest_collection_modifyitems(config, items):
    def rank(item):
        for i, key in enumerate(_SLOW_FIRST):
            if key in item.nodeid: return i
        return len(_SLOW_FIRST)
    items.sort(key=rank)   # stable: the rest keep their order

@pytest.fixture(scope='module')
def one_thread():
    "Torch on one thread for a module of tiny models: on a loaded 2-core machine two threads make their forward passes many times slower. Restored afterwards."
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

@pytest.fixture(autouse=True)
def _temp_files_under_pytest(tmp_path_factory, monkeypatch):
    "Whatever a test or a notebook writes through `tempfile` (and the processes it starts, through TMPDIR) goes to a folder of pytest's own, beside the test's `tmp_path` (which stays as the test made it), and pytest removes it after its next few runs: `make test` leaves nothing else in /tmp."
    d = tmp_path_factory.mktemp('tempfiles')
    monkeypatch.setattr(tempfile, 'tempdir', str(d))
    monkeypatch.setenv('TMPDIR', str(d))
