"""A hand-written training loop with `ActivationStats` and every option on (weights, param_grads, grads, per_channel, on_valid,
exact) over a small float64 MLP: in one process seeing whole batches (`run('single', out)`), or under torchrun on two ranks
(gloo, CPU), each seeing half of every batch, first with DDP and then with FSDP2 (`fully_shard`: layer 0 and layer 2 in units
of their own, so their hooks see their shards; layer 4 in the root's, so its hook sees it whole). Each run writes what it
recorded, after `all_reduce()`, to OUT/stats_<mode>_rank<r>.npz."""
import sys, numpy as np, torch, torch.nn.functional as F
from torch import nn
from miniai.activations import ActivationStats

STEPS, BS = 4, 32

def data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS + 1, BS, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (STEPS + 1, BS), generator=g)

def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 5), nn.ReLU(), nn.Linear(5, 4)).double()   # 5 rows: shards of 3 and 2

def wrapped(mode):
    "`(model, rank, world size)`: `model()` as `mode` trains it: alone ('single'), under DDP ('ddp') or FSDP2 ('fsdp')."
    import torch.distributed as dist
    r, ws = (dist.get_rank(), dist.get_world_size()) if mode != 'single' else (0, 1)
    m = model()
    if mode == 'ddp':
        from torch.nn.parallel import DistributedDataParallel
        m = DistributedDataParallel(m)
    elif mode == 'fsdp':
        from torch.distributed.fsdp import fully_shard
        for i in (0, 2): fully_shard(m[i])
        fully_shard(m)
    return m, r, ws

def main(run):
    "Under torchrun: join the gloo group, then `run(mode, out)` for each mode named on the command line (`out` first)."
    import torch.distributed as dist
    dist.init_process_group('gloo')
    try:
        for mode in sys.argv[2:]: run(mode, sys.argv[1])
    finally: dist.destroy_process_group()

def run(mode, out):
    m, r, ws = wrapped(mode)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    xs, ys = data()
    astats = ActivationStats([nn.Linear], exact=True, weights=True, param_grads=True, output_grads=True, per_channel=True, on_valid=True)
    with astats.attach(m):    # after wrapping: the hooks are on the parameters the wrapper trains
        for i in range(STEPS):
            loss = F.cross_entropy(m(xs[i][r::ws]), ys[i][r::ws])    # rank r: every ws-th item of the batch
            loss.backward(); opt.step(); opt.zero_grad()
        m.eval()
        with torch.no_grad(): m(xs[STEPS][r::ws])                  # a validation batch
    astats.all_reduce()        # a hand-written loop merges the ranks itself (a `Learner` with `DistributedCB` does it after fit)
    arrays = {}
    for phase in ('train', 'valid'):
        for name, recs in astats.recorders[phase].items():
            for key, rec in recs.items():
                if rec.n_batches: arrays[f'{phase}|{name}|{key}|moms'], arrays[f'{phase}|{name}|{key}|hists'] = rec.moments.t.numpy(), rec.hists.numpy()
    np.savez(f'{out}/stats_{mode}_rank{r}.npz', **arrays)

if __name__ == '__main__': main(run)
