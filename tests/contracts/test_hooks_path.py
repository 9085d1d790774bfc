"""The path from a hook to a pixel: how many of miniai's own Python functions one recorded forward and its `color_dim` image run.

Counted with `sys.setprofile`: every 'call' event whose code lives under `miniai/` (comprehensions and generator expressions
count as calls too). One linear layer, hooked by `ActivationStats`, one training forward driven the Learner's way
(`before_batch`, the forward, `after_batch`), then `color_dim()`. The budget covers all of miniai, the kernel's modules'
(`kernel.py`, `passes.py`, `loops.py`) `Recorder` and pass included; `attach` adds the pre- and post-hook it puts on the model (counted apart below).
"""
import os, sys, gc, collections
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
import pytest, torch, fastcore.all as fc
from torch import nn

import miniai
from miniai.activations import ActivationStats
from miniai.kernel import Recorder, use_kernel

ROOT = os.path.dirname(miniai.__file__) + os.sep
BUDGET = 20          # the whole path: hooks, activations, datasets' plotting helpers, the kernel's Recorder
KERNEL = ('kernel.py', 'passes.py', 'loops.py')   # the statistics kernel's modules


class CallCounter:
    "Count 'call' events of Python functions defined under miniai/ while the block runs: `(file, function)` in order."
    def __enter__(self):
        gc.collect(); gc.disable()   # an earlier test's hooks removed by the collector inside the block are not on this path
        self.calls = []
        def prof(frame, event, arg):
            if event == 'call' and frame.f_code.co_filename.startswith(ROOT):
                self.calls.append((os.path.basename(frame.f_code.co_filename), frame.f_code.co_name))
        sys.setprofile(prof)
        return self
    def __exit__(self, *args): sys.setprofile(None); gc.enable()
    def __len__(self): return len(self.calls)
    def in_file(self, *names): return sum(f in names for f, _ in self.calls)
    def __str__(self): return ' '.join(f'{f[:-3]}.{n}' for f, n in self.calls)


def one_forward_and_image(model, x):
    "Return the counters of one recorded forward (the Learner's way) and of its color_dim image."
    a = ActivationStats()
    learn = fc.NS(model=model)
    a.before_fit(learn); a.before_batch(learn)
    with CallCounter() as fwd: model(x)
    a.after_batch(learn); a.cleanup_fit(learn)
    with CallCounter() as img: a.color_dim()
    plt.close('all')
    return a, fwd, img


@pytest.fixture(scope='module')
def warm():
    "A first run compiles the kernel's loops and imports matplotlib's backends: not part of the path."
    with use_kernel('loops'): Recorder().record(torch.ones(10))   # waits for the compiled loops: the CPU's default path from then on
    model, x = nn.Sequential(nn.Linear(8, 8)), torch.randn(16, 8)
    one_forward_and_image(model, x)
    return model, x


def test_one_forward_and_its_image_within_budget(warm):
    a, fwd, img = one_forward_and_image(*warm)
    assert len(a.series()['0']) == 1 and a.fig is not None
    total = len(fwd) + len(img)
    kernel = fwd.in_file(*KERNEL) + img.in_file(*KERNEL)
    print(f'forward {len(fwd)} ({fwd.in_file(*KERNEL)} in the kernel): {fwd}\ncolor_dim {len(img)} ({img.in_file(*KERNEL)} in the kernel): {img}')
    # what hooks.py and activations.py add: the layer's hook (its HookFn with the pause check and the recompute dispatch, the callback's
    # gate, ActivationStats.hook) and the image (color_dim, the series, the grid, the picture, the titles)
    assert len(fwd) - fwd.in_file(*KERNEL) <= 4, str(fwd)
    assert len(img) - img.in_file(*KERNEL) <= 8, str(img)
    assert total <= BUDGET, f'{total} calls ({kernel} in the kernel); forward: {fwd}; color_dim: {img}'


def test_attach_adds_two_model_hooks_only(warm):
    "Under `attach`, the forward also runs the pre-hook that starts it and the post-hook that ends it: 7 calls more, none per layer."
    model, x = warm
    a = ActivationStats()
    with a.attach(model):
        with CallCounter() as fwd: model(x)
    _, plain, _ = one_forward_and_image(model, x)
    def own(c): return len(c) - c.in_file(*KERNEL)
    assert own(fwd) - own(plain) <= 7, f'{fwd}\n{plain}'
    assert collections.Counter(n for _, n in fwd.calls)['hook'] == 1


def test_main_recorder_read_once_per_plot(warm):
    "Each plot reads each layer's series once (the old path looked the recorder up three times per layer per plot)."
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    a = ActivationStats()
    with a.attach(model):
        for _ in range(2): model(torch.randn(4, 8))
    for plot in ('color_dim', 'dead_chart', 'plot_stats'):
        with CallCounter() as c: getattr(a, plot)()
        plt.close('all')
        assert collections.Counter(n for _, n in c.calls)['series'] == 1, (plot, str(c))
