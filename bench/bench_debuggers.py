"""Cost of the 10c debuggers on one batch of the lesson's BatchNorm CNN (FashionMNIST-sized random input).

Measured in one run, interleaved, `--rounds` rounds of `--reps` repetitions each (median per batch reported):
  step       one training step (forward, backward, SGD step): the reference
  forward    one forward pass in eval mode, no hooks
  fwd+dbg    the same forward pass with FeatureMapDebugger('0'), ActivationStatsDebugger('2'), LayerOutputDebugger('1') attached
  gradcam    GradCAMDebugger('2') on the batch (its own forward + backward to block 2)
  page       writing the results of one batch of all four as a page (npz + JSON, atomic), MB/s
Usage: .venv/bin/python bench/bench_debuggers.py [--bs 256] [--rounds 5] [--reps 5] [--threads 1]
"""
import argparse, statistics, tempfile, time, json
import torch, torch.nn.functional as F
from torch import nn
from miniai.debuggers import FeatureMapDebugger, ActivationStatsDebugger, LayerOutputDebugger, GradCAMDebugger, forward_pass, nbytes, write_page

def conv_bn(ni, nf, ks=3):
    return nn.Sequential(nn.Conv2d(ni, nf, ks, stride=2, padding=ks//2, bias=False), nn.BatchNorm2d(nf), nn.ReLU())
def bn_cnn():
    return nn.Sequential(conv_bn(1, 8, 5), conv_bn(8, 16), conv_bn(16, 32), conv_bn(32, 64), nn.Conv2d(64, 10, 3, stride=2, padding=1), nn.Flatten())

from _timing import per_call as timed   # the bench scripts' one timing helper: seconds per call of f() over `reps` calls

if __name__ == '__main__':
    p = argparse.ArgumentParser()
    p.add_argument('--bs', type=int, default=256); p.add_argument('--rounds', type=int, default=5); p.add_argument('--reps', type=int, default=5)
    p.add_argument('--threads', type=int, default=0, help='torch threads (0: torch default)')
    args = p.parse_args()
    if args.threads: torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, x, y = bn_cnn(), torch.rand(args.bs, 1, 28, 28), torch.randint(0, 10, (args.bs,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    fwd_dbgs = [FeatureMapDebugger('0'), ActivationStatsDebugger('2'), LayerOutputDebugger('1')]
    cam = GradCAMDebugger('2')
    folder = tempfile.mkdtemp()

    def step():
        model.train(); F.cross_entropy(model(x), y).backward(); opt.step(); opt.zero_grad()
    def forward(): forward_pass(model, x)
    def forward_dbg():
        for d in fwd_dbgs: d.attach(model)
        forward_pass(model, x)
        res = [d.pop() for d in fwd_dbgs]
        for d in fwd_dbgs: d.remove()
        return res
    def gradcam(): cam({'inputs': x}, model)
    record = {'results': dict(zip(['fm', 'stats', 'raw'], forward_dbg()), cam=cam({'inputs': x}, model))}
    page_mb = nbytes(record) / 2**20
    counter = iter(range(10**9))
    def page(): write_page(folder, f'page_{next(counter):05d}', [record])

    kinds = {'step': step, 'forward': forward, 'fwd+dbg': forward_dbg, 'gradcam': gradcam, 'page': page}
    for f in kinds.values(): f()   # warm-up
    times = {k: [] for k in kinds}
    for r in range(args.rounds):
        for k, f in kinds.items(): times[k].append(timed(f, args.reps))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {args.bs}, rounds {args.rounds} x {args.reps}")
    print(f"{'config':<10}{'ms/batch':>10}{'x step':>8}")
    for k in kinds: print(f"{k:<10}{med[k]*1000:>10.1f}{med[k]/med['step']:>8.2f}")
    print(f"forward-debugger overhead: {(med['fwd+dbg']/med['forward']-1)*100:.0f}% of a forward pass")
    print(f"page: {page_mb:.1f} MB in {med['page']*1000:.1f} ms = {page_mb/med['page']:.0f} MB/s")
    print(json.dumps({k: [round(t*1000, 2) for t in v] for k, v in times.items()}))
