"""Overhead of activation statistics on the lesson-10 baseline (FashionMNIST, batch 1024, 2 CPU cores).

Configurations, each a fresh `Learner` on the same batches:
  none      no hooks
  course    the course's append_stats (to_cpu copy, mean, std, 40-bin histc of |x|) on the 5 convs
  ours      ActivationStats (mean, std, 40-bin |x| histogram from a 16K stratified random sample) on the 5 convs
  exact     ActivationStats(exact=True): every value binned
  histc     ActivationStats-like hook with exact torch.histc instead of our bincount (the reference for `exact`)

Two modes:
  --mode alternate  (default) the marginal cost per batch: in each training epoch the hooks record every other
                    batch only (the callback's on/off switch), every batch is timed from before_batch to after_batch
                    (data loading excluded), and each recorded batch is compared with the mean of its two unrecorded
                    neighbours, 25 ms away, so that a machine's drifting speed cancels. Added time per batch = median
                    of those differences plus the final read of the statistics spread over the recorded batches;
                    reported as a share of an unrecorded batch and, the goal's measure, of one whole epoch
                    (added time x training batches / median time of a no-hook epoch with validation, same run).
                    --rounds epochs per configuration.
  --mode kernel     the recorders alone, on the five real activations of one training batch, interleaved with training
                    steps of the same model: per round, one training step (forward + backward + SGD step, no hooks), the
                    five `Recorder.record` calls, and one read of the same activations (`x.sum()`, the floor), each
                    the median of 20; the step as the median of 20.
                    Shares are (kernel time / training step time) per round, median over rounds: a load on the machine
                    slows all three alike, which whole-epoch timings on a loaded machine cannot separate.
  --mode epoch      whole epochs (59 training batches + validation), each configuration once per round, in a new
                    random order each round;
                    the overhead is the median over rounds of (that round's time / that round's no-hook time).
                    Round-to-round noise on a shared machine can be +-10%, too much to resolve a few percent.
Usage: .venv/bin/python bench/bench_activations.py [--mode alternate --rounds 3 | --mode epoch --rounds 7]
"""
import argparse, statistics, time, json, random
import torch, torch.nn.functional as F, fastcore.all as fc
from torch import nn
from miniai.datasets import fashion_dls
from miniai.learner import Learner, Callback, TrainCB, baseline_cnn, set_seed, to_cpu
from miniai.activations import ActivationStats, HooksCallback
from miniai.kernel import batch_moments


from _timing import clock   # the bench scripts' one timing helper; --clock cpu: time.process_time, the CPU time of this process (all its threads)

def course_stats(hook, mod, inp, outp):
    if not hasattr(hook, 'stats'): hook.stats = ([], [], [])
    acts = to_cpu(outp)
    hook.stats[0].append(acts.mean()); hook.stats[1].append(acts.std())
    hook.stats[2].append(acts.abs().histc(40, 0, 10))

def histc_stats(hook, mod, inp, outp):
    if not hasattr(hook, 'buf'): hook.buf = []
    hook.buf.append((batch_moments(outp), outp.detach().abs().histc(40, 0, 10)))

def make_cb(kind):
    conv = fc.risinstance(nn.Conv2d)
    return {'none': None, 'course': lambda: HooksCallback(course_stats, conv), 'ours': lambda: ActivationStats(conv),
            'exact': lambda: ActivationStats(conv, exact=True), 'histc': lambda: HooksCallback(histc_stats, conv)}[kind]

class Alternate(Callback):
    "Switch `cb`'s hooks off on odd batches and time every training batch."
    order = 100   # after the hooks callback has set its switch
    def __init__(self, cb): self.cb, self.times = cb, []
    def before_batch(self):
        if self.cb is not None and self.learn.iter % 2: self.cb._training = None
        self.t0 = clock()
    def after_batch(self): self.times.append(clock() - self.t0)

def fit_time(dls, kind, alternate=False):
    "Seconds for one epoch (or, alternating, the per-batch times and the time to read the statistics after fit)."
    set_seed(1)
    f = make_cb(kind)
    hooks_cb = f() if f else None
    cbs = [TrainCB()] + ([hooks_cb] if hooks_cb is not None else [])   # (a HooksCallback is falsy before fit: len 0)
    alt = Alternate(hooks_cb)
    if alternate: cbs.append(alt)
    learn = Learner(baseline_cnn(), dls, F.cross_entropy, lr=0.6, cbs=cbs)
    t0 = clock()
    learn.fit(1, valid=not alternate)
    t1 = clock()
    if hooks_cb is not None:   # reading the statistics once is part of the cost (our recorders finish their last samples then)
        for h in hooks_cb.hooks: getattr(h, 'stats', None)
    t2 = clock()
    return (alt.times, t2 - t1) if alternate else t2 - t0

def run_kernel(dls, rounds, reps=20):
    "The recorders alone on the five activations of one training batch, against one training step (interleaved)."
    from miniai.kernel import Recorder
    set_seed(1)
    model = baseline_cnn()
    xb, yb = next(iter(dls.train))
    acts = []
    hooks = [m.register_forward_hook(lambda m, i, o: acts.append(o.detach().clone())) for m in model.modules() if isinstance(m, nn.Conv2d)]
    model(xb)
    for h in hooks: h.remove()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def step():
        loss = F.cross_entropy(model(xb), yb); loss.backward(); opt.step(); opt.zero_grad()
    recs = [Recorder(seed=i) for i in range(len(acts))]
    def record():
        for r, a in zip(recs, acts): r.record(a)
    def one_read():
        for a in acts: a.sum()
    def med(f):
        ts = []
        for _ in range(reps):
            t0 = clock(); f(); ts.append(clock() - t0)
        return statistics.median(ts)
    for f in (step, record, one_read): med(f)   # warm-up
    rows = [(med(step), med(record), med(one_read)) for _ in range(rounds)]
    step_ms = statistics.median(r[0] for r in rows) * 1e3
    print(f"training step (no hooks): {step_ms:.2f} ms median; activations: {sum(a.numel() for a in acts)/1e6:.2f}M values in {len(acts)} layers")
    print(f"Recorder.record x5: {statistics.median(r[1] for r in rows)*1e3:.3f} ms = {statistics.median(r[1]/r[0] for r in rows)*100:.2f}% of a step")
    print(f"one read (x.sum) x5, the floor: {statistics.median(r[2] for r in rows)*1e3:.3f} ms = {statistics.median(r[2]/r[0] for r in rows)*100:.2f}% of a step")

def quartiles(v): q = statistics.quantiles(v, n=4); return q[0], q[2]

def run_alternate(dls, kinds, rounds):
    epoch = statistics.median(fit_time(dls, 'none') for _ in range(3))   # a whole epoch (training + validation), no hooks
    n_train = len(dls.train)
    print(f"one epoch without hooks: {epoch:.2f} s ({n_train} training batches + validation)")
    print(f"{'config':<8}{'ms/batch off':>13}{'added ms':>10}{'of a batch':>12}{'  quartiles':>18}{'of an epoch':>13}")
    res = {}
    for k in kinds[1:]:
        added, base, reads, n_on = [], [], 0., 0
        for r in range(rounds):
            ts, read = fit_time(dls, k, alternate=True)
            reads += read
            for i in range(2, len(ts) - 1, 2):   # recorded batches (even), not the first (warm-up)
                added.append(ts[i] - (ts[i-1] + ts[i+1]) / 2); n_on += 1
            base += ts[1::2]
        b, extra = statistics.median(base), reads / n_on
        ratios = [(a + extra) / b for a in added]
        lo, hi = quartiles(ratios)
        per_batch = statistics.median(added) + extra
        res[k] = per_batch * n_train / epoch
        print(f"{k:<8}{b*1e3:>13.2f}{per_batch*1e3:>10.2f}{statistics.median(ratios)*100:>11.1f}%"
              f"{lo*100:>9.1f}% .. {hi*100:.1f}%{res[k]*100:>12.1f}%")
    return res

def run_epoch(dls, kinds, rounds):
    for k in kinds: fit_time(dls, k)  # warm-up: scratch buffers, sample tables, allocator
    times, rng = {k: [] for k in kinds}, random.Random(0)
    for r in range(rounds):
        order = kinds[:]
        rng.shuffle(order)   # a new order each round: no configuration always follows the same one
        for k in order: times[k].append(fit_time(dls, k))
    # each round's ratio to that round's no-hook epoch, then the median: steadier than a ratio of medians on a noisy VM
    ratios = {k: [t/n for t, n in zip(times[k], times['none'])] for k in kinds}
    print(f"{'config':<8}{'epoch s':>9}{'overhead':>10}{'  quartiles':>12}")
    for k in kinds:
        lo, hi = quartiles(ratios[k])
        print(f"{k:<8}{statistics.median(times[k]):>9.2f}{(statistics.median(ratios[k])-1)*100:>9.1f}%{(lo-1)*100:>8.1f}% .. {(hi-1)*100:.1f}%")
    print(json.dumps({k: [round(t, 3) for t in v] for k, v in times.items()}))

if __name__ == '__main__':
    p = argparse.ArgumentParser()
    p.add_argument('--mode', choices=['alternate', 'epoch', 'kernel'], default='alternate')
    p.add_argument('--rounds', type=int, default=None, help='default 3 (alternate) or 7 (epoch)')
    p.add_argument('--clock', choices=['wall', 'cpu'], default='wall',
                   help="wall: elapsed time; cpu: this process's CPU time, which a VM's stolen time and other jobs disturb less")
    args = p.parse_args()
    if args.clock == 'cpu': clock = time.process_time
    rounds = args.rounds or (3 if args.mode == 'alternate' else 7)
    dls = fashion_dls(1024)
    kinds = ['none', 'course', 'ours', 'exact', 'histc']
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, mode {args.mode}, rounds {rounds}")
    if args.mode == 'kernel': run_kernel(dls, rounds)
    elif args.mode == 'alternate':
        fit_time(dls, 'ours', alternate=True)   # warm-up: scratch buffers, sample tables, allocator
        run_alternate(dls, kinds, rounds)
    else: run_epoch(dls, kinds, rounds)
