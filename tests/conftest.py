import os
os.environ.setdefault('MPLBACKEND', 'Agg')

import pytest, torch

@pytest.fixture(scope='module')
def one_thread():
    "Torch on one thread for a module of tiny models: on a loaded 2-core machine two threads make their forward passes many times slower. Restored afterwards."
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
