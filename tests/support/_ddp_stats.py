"""One epoch of the baseline (float64) on 4096 FashionMNIST images with ActivationStats(exact=True): under torchrun with
DistributedCB (each rank 256 of each batch of 512), or in one process seeing the same batches of 512 whole ('single').
Writes the per-batch statistics of every hooked layer (rank 0) to OUT/stats_<mode>.npz."""
import sys, torch, numpy as np, torch.nn.functional as F, fastcore.all as fc
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler
from miniai.datasets import fashion_dls, DataLoaders, TensorDictDataset
from miniai.learner import Learner, TrainCB, baseline_cnn, set_seed
from miniai.activations import ActivationStats, main_recorder
from miniai.core import rank, world_size
from miniai.distributed import DistributedCB

mode, out = sys.argv[1], sys.argv[2]
set_seed(1)
full = fashion_dls(512)
ds = full.train.dataset
sub = TensorDictDataset(tfm=ds.tfm, **{k: v[:4096] for k, v in ds.tensors.items()})
vds = full.valid.dataset
vsub = TensorDictDataset(tfm=vds.tfm, **{k: v[:1024] for k, v in vds.tensors.items()})
coll = full.train.collate_fn
if mode == 'ddp': train = DataLoader(sub, batch_size=256, shuffle=True, collate_fn=coll)   # DistributedCB re-shards it
else: train = DataLoader(sub, batch_size=512, sampler=DistributedSampler(sub, 1, 0, shuffle=True, seed=0), collate_fn=coll)
dls = DataLoaders(train, DataLoader(vsub, batch_size=512, collate_fn=coll))

class Train64(TrainCB):
    def predict(self, learn): learn.preds = learn.model(learn.batch[0].double())

astats = ActivationStats(fc.risinstance(nn.Conv2d), exact=True)
cbs = [Train64(), astats] + ([DistributedCB(seed=0)] if mode == 'ddp' else [])
learn = Learner(baseline_cnn().double(), dls, F.cross_entropy, lr=0.1, cbs=cbs, opt_func=torch.optim.SGD)
learn.fit(1)
if rank() == 0:
    arrays = {}
    for i, h in enumerate(astats):
        rec = main_recorder(h)
        arrays[f'moms{i}'], arrays[f'hists{i}'] = rec.moments.t.numpy(), rec.hists.numpy()
    np.savez(f'{out}/stats_{mode}.npz', world_size=world_size(), **arrays)
