"""The one timing helper of the bench scripts: a clock, the one-read floor hooks the hooks are measured against, a wrapper that sums the time spent inside a function, best-of and
interleaved shuffled rounds, quartiles of ratios, and the name of the machine's CPU (a figure means little without it)."""
import os, platform, random, statistics, time

clock = time.perf_counter

def cpu_name():
    "The CPU's model name (from /proc/cpuinfo on Linux) and the number of cores this process may use."
    name = platform.processor() or platform.machine()
    try:
        for line in open('/proc/cpuinfo'):
            if line.startswith('model name'): name = line.split(':', 1)[1].strip(); break
    except OSError: pass
    return f"{name}, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores"

class Inside:
    "Sums the time (wall clock, or `clock`) spent inside the functions it wraps, and counts their calls: `wrap(f)`, then read `seconds`, `calls`."
    def __init__(self, clock=None): self.clock = clock; self.reset()
    def reset(self): self.seconds, self.calls = 0., 0
    def wrap(self, f):
        def g(*args, **kwargs):
            now = self.clock or clock
            t0 = now()
            try: return f(*args, **kwargs)
            finally:
                self.seconds += now() - t0; self.calls += 1
        return g

def once(f):
    "Seconds one call of `f()` takes."
    t0 = clock(); f(); return clock() - t0

def per_call(f, reps=1, rounds=1):
    "Seconds per call of `f()`: the best over `rounds` of the mean over `reps` calls."
    best = float('inf')
    for _ in range(rounds):
        t0 = clock()
        for _ in range(reps): f()
        best = min(best, (clock() - t0) / reps)
    return best

def interleaved(fns, rounds, seed=0, reps=1, log=None):
    "`{name: [seconds per call in each round]}`: each round calls every function of dict `fns` (`reps` times) once, in a new random order, so that a slow spell of a shared machine hits them all alike."
    times, rng = {n: [] for n in fns}, random.Random(seed)
    for r in range(rounds):
        order = list(fns); rng.shuffle(order)
        for n in order: times[n].append(per_call(fns[n], reps))
        if log: log(r, times)
    return times

def quartiles(xs):
    "Median and quartiles of `xs` (the one value three times when there is one)."
    xs = sorted(xs)
    if len(xs) == 1: return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4)
    return statistics.median(xs), q[0], q[2]

def ratios(times, base):
    "Round by round ratios of `times` to `base` (same rounds)."
    return [t / b for t, b in zip(times, base)]


def one_read(hook, mod, inp, outp):
    "The floor a statistics hook is measured against: one read (a sum) of the output, kept on the device."
    if not hasattr(hook, 'sums'): hook.sums = []
    hook.sums.append(outp.detach().sum())

def one_read_io(hook, mod, inp, outp):
    "The floor of a hook that reads inputs and outputs (the collector's default): one read of each."
    if not hasattr(hook, 'sums'): hook.sums = []
    hook.sums.append((inp[0].detach().sum(), outp.detach().sum()))
