"""The run-wide collector with its parameters' values and gradients on (`collect_weights`, `collect_param_grads`) in a hand-written
loop over the small float64 MLP of `_fsdp_stats`: in one process seeing whole batches (`run('single', out)`), or under torchrun on
two ranks (gloo, CPU), each seeing half of every batch, with DDP and then FSDP2 (`fully_shard`). Each run writes its statistics,
after `all_reduce()`, to OUT/collector_<mode>_rank<r>.json (the `json` export)."""
import json, torch, torch.nn.functional as F
from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
from _fsdp_stats import STEPS, data, wrapped, main

def run(mode, out):
    m, r, ws = wrapped(mode)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    xs, ys = data()
    coll = ActivationStatisticsHook(StatisticsConfig(collect_weights=True, collect_param_grads=True, collect_percentiles=[], exact=True))
    with coll.attach(m, layers=torch.nn.Linear):
        for i in range(STEPS):
            loss = F.cross_entropy(m(xs[i][r::ws]), ys[i][r::ws])    # rank r: every ws-th item of the batch
            loss.backward(); opt.step(); opt.zero_grad()
    if mode != 'single': coll.all_reduce()
    with open(f'{out}/collector_{mode}_rank{r}.json', 'w') as f: json.dump(coll.export_statistics(), f)

if __name__ == '__main__': main(run)
