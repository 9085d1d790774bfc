"""DistributedCB merges every callback that holds statistics through that callback's own `all_reduce()`: StatisticsCB,
ActivationStats and a callback of the user's. Two CPU ranks (gloo) under torchrun."""
import json
from _torchrun import run_two_ranks

# two ranks fit a small model with DistributedCB, a StatisticsCB, an ActivationStats and a callback of our own that defines
# `all_reduce`; rank r writes what it holds after fit to OUT/rank<r>.json
SCRIPT = r'''
import sys, json, torch, torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from miniai.datasets import DataLoaders
from miniai.learner import Learner, TrainCB, Callback
from miniai.activations import ActivationStats
from miniai.statistics import StatisticsConfig
from miniai.monitoring import StatisticsCB
from miniai.core import rank
from miniai.distributed import DistributedCB

class Counted(Callback):
    "Holds one number per rank; its all_reduce sums them (the way any callback joins the merge)."
    def __init__(self): self.value, self.calls = torch.tensor([float(rank() + 1)]), 0
    def all_reduce(self, group=None):
        import torch.distributed as dist
        dist.all_reduce(self.value, group=group); self.calls += 1

g = torch.Generator().manual_seed(0)
ds = list(zip(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)))
dls = DataLoaders(DataLoader(ds, 16), DataLoader(ds, 16))          # DistributedCB shards them: 32 items per rank
torch.manual_seed(0)
stats_cb = StatisticsCB(StatisticsConfig(collect_input=False), layers=['0'])
astats, counted = ActivationStats(['0']), Counted()
Learner(nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)), dls, F.cross_entropy, lr=0.1,
        cbs=[TrainCB(), stats_cb, astats, counted, DistributedCB()]).fit(1)
st = stats_cb.stats.get_statistics('0')
json.dump(dict(count=st.output_stats.count, n_updates=st.n_updates, counted=counted.value.item(), calls=counted.calls,
               batch_counts=astats.series()['0'].moments.count.tolist()), open(f'{sys.argv[1]}/rank{rank()}.json', 'w'))
'''

def test_every_callback_with_all_reduce_is_merged(tmp_path):
    (tmp_path/'fit.py').write_text(SCRIPT)
    res = run_two_ranks(tmp_path/'fit.py', tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = [json.loads((tmp_path/f'rank{r}.json').read_text()) for r in (0, 1)]
    for r in ranks:
        assert r['count'] == 64 * 5                      # StatisticsCB: both ranks' 32 items x 5 outputs, on each rank
        assert r['n_updates'] == 2 * 2                   # 2 training batches per rank, merged
        assert (r['counted'], r['calls']) == (1. + 2., 1)   # the user's callback: merged once, after fit
        assert r['batch_counts'] == [2 * 16. * 5] * 2    # ActivationStats: each batch holds both ranks' batches of 16
    assert ranks[0] == ranks[1]
