"""ActivationStats' plots as a script uses them: each draws once and returns nothing (Jupyter shows the figure once), the
figure is `astats.fig` to save, panels are titled with the layer names and kinds, lines at 1 stay inside the frame, the legend
beside the panels; keeping the callback does not keep its model alive.
(These were hidden cells of lesson 10 that drew figures only to close them.)"""
import gc, itertools, weakref
import pytest
import matplotlib.pyplot as plt
import torch.nn.functional as F
from torch import nn
import fastcore.all as fc
from miniai.datasets import fashion_dls, DataLoaders
from miniai.learner import Learner, TrainCB, SingleBatchCB, baseline_cnn, set_seed
from miniai.activations import ActivationStats

def _dls(n_train=6):
    full = fashion_dls(256)
    return DataLoaders(list(itertools.islice(full.train, n_train)), list(itertools.islice(full.valid, 1)))

def test_plots_return_nothing_save_through_fig_and_title_layers_by_name(tmp_path):
    set_seed(1)
    astats = ActivationStats(fc.risinstance(nn.Conv2d))
    Learner(baseline_cnn(), _dls(), F.cross_entropy, lr=0.6, cbs=[TrainCB(), astats]).fit(1)
    for name in ('color_dim', 'dead_chart', 'plot_stats'):
        assert getattr(astats, name)() is None, name          # nothing for Jupyter to show a second time
        astats.fig.savefig(tmp_path/f'{name}.png'); plt.close(astats.fig)
        assert (tmp_path/f'{name}.png').stat().st_size > 10_000, name
    titles = ['0.0 Conv2d 1→8', '1.0 Conv2d 8→16', '2.0 Conv2d 16→32', '3.0 Conv2d 32→64', '4 Conv2d 64→10']
    assert [t.split()[0] for t in titles] == astats.names
    try:
        for name in ('color_dim', 'dead_chart'):
            getattr(astats, name)()
            assert [ax.get_title() for ax in astats.fig.axes[:5]] == titles, name   # each layer's name and what it is
        assert all(ax.get_ylim()[1] > 1 for ax in astats.fig.axes[:5])            # a dead fraction of 1 is drawn inside the frame
        astats.plot_stats()
        fig = astats.fig
        [leg] = fig.legends                                                          # one legend, beside the panels, not on a line
        assert [t.get_text() for t in leg.get_texts()] == titles and not any(ax.get_legend() for ax in fig.axes)
        fig.canvas.draw()
        assert leg.get_window_extent().x0 >= max(ax.get_window_extent().x1 for ax in fig.axes)
    finally: plt.close('all')

def test_loaded_statistics_title_their_panels_by_name(tmp_path):
    "A run saved and loaded again does not know its layers' kinds: its panels are titled with the names alone."
    set_seed(1)
    astats = ActivationStats(fc.risinstance(nn.Conv2d))
    Learner(baseline_cnn(), _dls(2), F.cross_entropy, lr=0.6, cbs=[TrainCB(), astats]).fit(1)
    loaded = ActivationStats.load(astats.save(tmp_path/'run'))
    loaded.dead_chart()
    try: assert [ax.get_title() for ax in loaded.fig.axes[:5]] == loaded.names == astats.names
    finally: plt.close('all')

def test_keeping_activation_stats_does_not_keep_the_model_alive():
    dls = _dls(2)
    def train_and_forget():
        model = baseline_cnn()
        a = ActivationStats(output_grads=True)
        Learner(model, dls, F.cross_entropy, lr=0.1, cbs=[TrainCB(), SingleBatchCB(), a]).fit(1)
        return a, weakref.ref(model)
    kept, model_ref = train_and_forget(); gc.collect()
    assert model_ref() is None, 'keeping ActivationStats kept the model alive'
    kept.plot_stats()                                        # and what it kept still draws
    try: assert len(kept.fig.axes) >= 2
    finally: plt.close('all')

def test_layers_without_data_are_named_in_each_plots_title():
    "A layer that records nothing (None, a complex tensor) and one that is all NaN: each plot draws the others and names the silent ones with why."
    import math, torch
    from miniai.learner import run_cbs
    class Nothing(nn.Module):
        def forward(self, x): return None
    class Complex(nn.Module):
        def forward(self, x): return torch.complex(x, x)
    class AllNaN(nn.Module):
        def forward(self, x): return x * math.nan
    net = nn.ModuleDict(dict(lin=nn.Linear(4, 4), none=Nothing(), cplx=Complex(), nan=AllNaN()))
    a = ActivationStats(mods=list(net.values()))
    learn = Learner(net, [[(torch.randn(3, 4),)]], cbs=[a]); learn.model = net   # drive the hooks by hand
    run_cbs([a], 'before_fit', learn)
    for _ in range(3):
        run_cbs([a], 'before_batch'); x = torch.randn(3, 4); [m(x) for m in net.values()]; run_cbs([a], 'after_batch')
    run_cbs([a], 'cleanup_fit')
    for name in ('color_dim', 'dead_chart', 'plot_stats'):
        getattr(a, name)()
        try: assert 'none (output: output is NoneType, not a tensor)' in a.fig._suptitle.get_text(), name
        finally: plt.close(a.fig)
    with pytest.raises(ValueError, match='no hooked layer recorded train statistics to plot: no layers hooked'): ActivationStats().color_dim()
    with pytest.raises(ValueError, match=r'no hooked layer recorded valid statistics to plot: lin \(nothing recorded\)'): a.color_dim(phase='valid')
