"""Launching a script on two CPU ranks (gloo) under torchrun, for the tests of several processes."""
import os, socket, subprocess, sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

def free_port():
    "A TCP port on the loopback that is free right now."
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]

def torchrun_env():
    "The environment for worker processes: one OpenMP thread each, the repo importable, no display."
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''))
    env.setdefault('MPLBACKEND', 'Agg')
    return env

def run_two_ranks(script, *args, timeout=180):
    "Run `script` with `args` on two ranks of one node (loopback rendezvous); returns the CompletedProcess."
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2', '--nnodes=1',
           '--master_addr=127.0.0.1', f'--master_port={free_port()}', str(script), *map(str, args)]
    return subprocess.run(cmd, env=torchrun_env(), timeout=timeout, capture_output=True, text=True)
