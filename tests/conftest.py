import os, time
os.environ.setdefault('MPLBACKEND', 'Agg')
_workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))
if _workers > 1:   # one torch thread per xdist worker: two workers x two threads on two cores stall each other (OpenMP spinning)
    os.environ['OMP_NUM_THREADS'] = '1'   # also for the subprocesses the tests start (CLI, torchrun)

import pytest, torch
if _workers > 1: torch.set_num_threads(1)

# the longest tests first, so that with several workers the tail is short (xdist hands out tests in this order)
_SLOW_FIRST = ['11_initializing', '10_activations', '10a_statistics', '10c_debuggers', '10b_dumps', 'test_course_lesson11',
               'test_course_lesson10', '90_cli', 'index', 'test_cli', '09_learner']

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
