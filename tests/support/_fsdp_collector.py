"""The run-wide collector with its parameters' values and gradients on (`collect_weights`, `collect_param_grads`) in a hand-written
loop over the small float64 MLP of `_fsdp_stats`: in one process seeing whole batches (`run('single', out)`), or under torchrun on
two ranks (gloo, CPU), each seeing half of every batch, with DDP and then FSDP2 (`fully_shard`). Each run writes its statistics,
after `all_reduce()`, to OUT/collector_<mode>_rank<r>.json (the `json` export)."""
import sys, json, torch, torch.nn.functional as F
from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
from _fsdp_stats import STEPS, data, model

def run(mode, out):
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
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    xs, ys = data()
    coll = ActivationStatisticsHook(StatisticsConfig(collect_weights=True, collect_param_grads=True, collect_percentiles=[], exact=True))
    with coll.attach(m, layers=torch.nn.Linear):
        for i in range(STEPS):
            loss = F.cross_entropy(m(xs[i][r::ws]), ys[i][r::ws])    # rank r: every ws-th item of the batch
            loss.backward(); opt.step(); opt.zero_grad()
    if mode != 'single': coll.all_reduce()
    with open(f'{out}/collector_{mode}_rank{r}.json', 'w') as f: json.dump(coll.export_statistics(), f)

if __name__ == '__main__':
    import torch.distributed as dist
    dist.init_process_group('gloo')
    try:
        for mode in sys.argv[2:]: run(mode, sys.argv[1])
    finally: dist.destroy_process_group()
