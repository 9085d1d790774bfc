"""A torch.compile'd model with ActivationStats attached after compiling (issue #31): the compiled training step without hooks,
inside `attach`, and after the `with` block exited, against the same step in eager mode.

Five copies of one small conv net (the course's `baseline_cnn`, 1x28x28 inputs, batch --bs, random data: nothing is read),
each trained by SGD on the same batch (forward, cross-entropy, backward, step):
  eager          no hooks
  eager+stats    ActivationStats attached (the five convs), for the whole run
  compiled       torch.compile(backend=--backend), never hooked
  compiled+stats torch.compile'd, then ActivationStats attached for the whole run: `attach` compiles a forward of its own
                 that calls each hook through one `miniai::hook` op
  compiled+noop  the same with a HooksCallback whose hook does nothing: the cost of the hooks' path alone (the op, the
                 callback's gate), without statistics
  after          torch.compile'd, warmed, attached for --after-steps steps, then the block exited: its code compiled before
                 runs again
Every round times each configuration (the mean of --reps steps) in a new random order, so that a slow spell of a shared
machine hits them all alike; ratios are taken round by round against `compiled` (and `eager`), medians and quartiles over
rounds. Also reported: dynamo's graph breaks and the graphs compiled in each phase (zero breaks; one graph per compile).
Usage: .venv/bin/python bench/bench_compile.py [--rounds 15 --reps 5 --bs 256 --threads 1 --backend inductor]
"""
import argparse, copy, time, warnings
import torch, torch.nn.functional as F
import torch._dynamo as dynamo
from miniai.learner import baseline_cnn, set_seed
from miniai.activations import ActivationStats, HooksCallback
from _timing import interleaved, quartiles, ratios, cpu_name, once

p = argparse.ArgumentParser()
p.add_argument('--rounds', type=int, default=15)
p.add_argument('--reps', type=int, default=5)
p.add_argument('--bs', type=int, default=256)
p.add_argument('--threads', type=int, default=1)
p.add_argument('--backend', default='inductor')
p.add_argument('--after-steps', type=int, default=3)
a = p.parse_args()
torch.set_num_threads(a.threads)

set_seed(0)
base = baseline_cnn()
x, y = torch.randn(a.bs, 1, 28, 28), torch.randint(0, 10, (a.bs,))

def stepper(run, params):
    opt = torch.optim.SGD(params, lr=1e-3)     # small steps: the weights stay sane over the run
    def step():
        F.cross_entropy(run(x), y).backward(); opt.step(); opt.zero_grad()
    return step

def counts(): return sum(dynamo.utils.counters['graph_break'].values()), dynamo.utils.counters['stats']['unique_graphs']

models = {n: copy.deepcopy(base) for n in ('eager', 'eager+stats', 'compiled', 'compiled+stats', 'compiled+noop', 'after')}
runs = {n: m if n.startswith('eager') else torch.compile(m, backend=a.backend) for n, m in models.items()}
steps = {n: stepper(runs[n], models[n].parameters()) for n in models}
log = []
for n in ('compiled', 'compiled+stats', 'compiled+noop', 'after'):   # compiled first, as a user does, and warmed
    t = once(steps[n]); steps[n]()
    log.append(f"compile {n}: {t:.1f} s")
b0, g0 = counts()

st_eager, st_comp, st_after = ActivationStats(), ActivationStats(), ActivationStats()
noop = HooksCallback(lambda *args: None, layers=torch.nn.Conv2d)
blocks = [st_eager.attach(runs['eager+stats']), st_comp.attach(runs['compiled+stats']), noop.attach(runs['compiled+noop'])]
for b in blocks: b.__enter__()
t = once(steps['compiled+stats']); log.append(f"first step inside attach (compiles the hooked forward): {t:.1f} s")
steps['compiled+noop']()
with st_after.attach(runs['after']):
    for _ in range(a.after_steps): steps['after']()
b1, g1 = counts()
t = once(steps['after']); steps['after']()
b2, g2 = counts()
log.append(f"first step after the block: {t:.3f} s; graphs compiled by then: {g2 - g1} more (0: no recompile)")

times = interleaved(steps, a.rounds, reps=a.reps)
for b in reversed(blocks): b.__exit__(None, None, None)
b3, g3 = counts()

n_rec = {n: [len(st.recorders['train'][k]['output']) for k in st.names] for n, st in (('eager+stats', st_eager), ('compiled+stats', st_comp), ('after', st_after))}
n_rec['compiled+noop'] = list(noop.calls.values())
print(f"torch {torch.__version__}, backend {a.backend}, {cpu_name()}, {a.threads} torch thread(s), batch {a.bs}; "
      f"load average at the end: {', '.join(f'{v:.1f}' for v in __import__('os').getloadavg())}")
print('\n'.join(log))
print(f"graph breaks: {b0} before attach, {b1 - b0} inside attach, {b3 - b1} after; graphs: {g0} compiled before attach, "
      f"{g1 - g0} for the hooked forwards (one per `attach`), {g3 - g1} after the block")
print(f"batches recorded per conv: {n_rec}")
print(f"\n| configuration | step (ms), median [quartiles] | / compiled | / eager |\n|---|---|---|---|")
for n in steps:
    med, lo, hi = quartiles(times[n])
    rc, re = quartiles(ratios(times[n], times['compiled']))[0], quartiles(ratios(times[n], times['eager']))[0]
    print(f"| {n} | {med*1e3:.1f} [{lo*1e3:.1f}-{hi*1e3:.1f}] | {rc:.3f} | {re:.3f} |")
