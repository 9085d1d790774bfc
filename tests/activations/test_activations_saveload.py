"""`ActivationStats` saved (`save_stats`), loaded (`load_stats`) and compared between two runs (`compare_stats`,
`plot_compare`), with real tiny models: a loaded run gives the original's numbers bit for bit, a bad folder is refused
with a clear error, and two runs that differ in one layer or from one batch show exactly that."""
import json, math, os, shutil
import numpy as np, pytest, torch
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt
from torch import nn
from miniai.activations import ActivationStats
from miniai.compare import save_stats, load_stats, compare_stats, plot_compare, format_comparison
from miniai.kernel import Recorder


class Pair(nn.Module):
    "A layer with two outputs (two streams) and one that returns an int tensor (skipped, with why)."
    def __init__(self): super().__init__(); self.lin = nn.Linear(16, 16)
    def forward(self, x): y = self.lin(x); return y, y.relu()

class Count(nn.Module):
    def forward(self, x): return torch.tensor(len(x))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU())
        self.pair, self.count, self.head = Pair(), Count(), nn.Linear(16, 3)
    def forward(self, x):
        h = self.conv(x).mean((2, 3)).repeat(1, 4)
        a, b = self.pair(h)
        self.count(a)
        return self.head(a + b)

def _record(astats, model, train_steps=5, valid_steps=2, seed=0):
    "Record `train_steps` SGD steps and `valid_steps` evaluation forwards of `model` on random data (the same for the same seed)."
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with astats.attach(model):
        model.train()
        for _ in range(train_steps):
            x, y = torch.randn(8, 1, 6, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
            nn.functional.cross_entropy(model(x), y).backward(); opt.step(); opt.zero_grad()
        model.eval()
        with torch.no_grad():
            for _ in range(valid_steps): model(torch.randn(8, 1, 6, 6, generator=g))
    return astats

def _run(**kw):
    torch.manual_seed(0)
    kw = dict(dict(layers=['conv.0', 'pair', 'count', 'head'], output_grads=True, on_valid=True, every=2), **kw)
    return _record(ActivationStats(**kw), Net())

def _bits(t): return t.view(torch.int64) if t.dtype == torch.float64 else t

def _same_recorders(a, b):
    "Every recorder of `a` and `b`, both phases and every stream: the same settings and, bit for bit, the same rows and bins."
    assert {p: {n: sorted(r) for n, r in l.items()} for p, l in a.recorders.items()} == \
           {p: {n: sorted(r) for n, r in l.items()} for p, l in b.recorders.items()}
    for phase, layers in a.recorders.items():
        for name, recs in layers.items():
            for key, ra in recs.items():
                rb = b.recorders[phase][name][key]
                assert [getattr(ra, k) for k in ('bins', 'hi', 'sample', 'exact', 'fold', 'zeros', 'ranges', 'minmax', 'seed', 'n_batches')] == \
                       [getattr(rb, k) for k in ('bins', 'hi', 'sample', 'exact', 'fold', 'zeros', 'ranges', 'minmax', 'seed', 'n_batches')]
                sa, sb = ra.state_dict(), rb.state_dict()
                assert torch.equal(_bits(sa['rows']), _bits(sb['rows'])) and torch.equal(sa['raw'], sb['raw']), (phase, name, key)
                if len(ra):
                    assert torch.equal(ra.hists, rb.hists)
                    for s in ('means', 'stds', 'dead', 'overflow'): assert torch.equal(_bits(getattr(ra, s)), _bits(getattr(rb, s))), s

def _figure_data(fig):
    "What a figure draws: each line's points and each image's pixels, axis by axis."
    out = []
    for ax in fig.axes:
        out += [np.asarray(l.get_xydata()) for l in ax.lines] + [np.asarray(im.get_array()) for im in ax.images]
    return out

def test_round_trip_is_bit_identical(tmp_path):
    run = _run()
    assert run.skipped['count'] and len(run.recorders['train']['pair']) == 4   # two outputs and their gradients
    folder = save_stats(run, tmp_path/'run')
    assert sorted(p.name for p in folder.iterdir()) == ['meta.json', 'recorders.npz']
    back = load_stats(folder)
    assert type(back) is ActivationStats
    assert (back.names, back.every, back.bins, back.hi, back.grads, back.on_valid, back.skipped) == \
           (run.names, run.every, run.bins, run.hi, run.grads, run.on_valid, run.skipped)
    _same_recorders(run, back)
    for phase in ('train', 'valid'):
        assert list(back.series(phase)) == list(run.series(phase))
        assert repr(back.diagnose(phase=phase)) == repr(run.diagnose(phase=phase))     # NaN rows too (the skipped layer)
        for plot in ('color_dim', 'dead_chart', 'plot_stats'):
            getattr(run, plot)(phase=phase); want = _figure_data(run.fig)
            getattr(back, plot)(phase=phase); got = _figure_data(back.fig)
            assert len(got) == len(want) and all(np.array_equal(g, w, equal_nan=True) for g, w in zip(got, want)), (phase, plot)
            plt.close('all')
    # the files are standard: JSON, and an npz that loads without pickle
    meta = json.loads((folder/'meta.json').read_text())
    assert meta['format'] == 'miniai.activation_stats' and meta['version'] == 2 and meta['settings']['every'] == 2
    with np.load(folder/'recorders.npz', allow_pickle=False) as z: assert all(z[k].dtype in (np.float64, np.int64) for k in z.files)

def test_the_methods_save_load_and_compare(tmp_path):
    "`astats.save`, `ActivationStats.load` and `astats.compare`: the functions above, as methods."
    run = _run()
    assert run.save(tmp_path/'run') == tmp_path/'run'
    back = ActivationStats.load(tmp_path/'run')
    assert type(back) is ActivationStats
    _same_recorders(run, back)
    rows = run.compare(back)
    assert rows and all(r['first'] is None for r in rows)
    torch.manual_seed(0)
    other = _record(ActivationStats(layers=['conv.0', 'pair', 'count', 'head'], output_grads=True, on_valid=True, every=2), Net(), seed=1)
    differ = run.compare(other)
    assert [r['first'] for r in differ if r['layer'] == 'conv.0'][0] == 0   # other data: the first layer differs from batch 0
    assert str(differ) == format_comparison(differ) and 'conv.0' in str(differ)

def test_saving_again_replaces_and_layers_given_as_modules_are_names(tmp_path):
    first, second = _run(), _run(every=1)
    save_stats(first, tmp_path/'r'); save_stats(second, tmp_path/'r')
    back = load_stats(tmp_path/'r')
    assert back.every == 1 and len(back.series()['head']) == 5
    picked = _record(ActivationStats(layers=lambda m: isinstance(m, nn.Linear)), Net())
    assert load_stats(save_stats(picked, tmp_path/'m')).layers == picked.names == ['pair.lin', 'head']

def test_round_trip_of_the_new_options(tmp_path):
    run = _run(hi='auto', weights=True, param_grads=True, per_channel=True, output_grads=False)
    his = {n: r.hi for n, r in run.series().items()}
    assert len(set(his.values())) > 1            # each layer its own histogram top
    back = load_stats(save_stats(run, tmp_path/'r'))
    _same_recorders(run, back)
    assert {n: r.hi for n, r in back.series().items()} == his and back.hi == 'auto'
    assert list(back.params()) == list(run.params()) and list(back.params(grads=True)) == list(run.params(grads=True))
    for phase, layers in run.channels.items():
        for name, streams in layers.items():
            for key, cs in streams.items():
                got = back.channels[phase][name][key]
                assert len(got) == len(cs) and got.dim == cs.dim
                assert torch.equal(_bits(got.moments.t), _bits(cs.moments.t)) and torch.equal(_bits(got.stds), _bits(cs.stds))
    assert repr(back.diagnose()) == repr(run.diagnose())
    run.color_dim(); want = _figure_data(run.fig); back.color_dim()
    assert all(np.array_equal(g, w, equal_nan=True) for g, w in zip(_figure_data(back.fig), want))
    plt.close('all')

def _saved(tmp_path, name='r'):
    "A copy, in `tmp_path/name`, of one saved run (recorded once)."
    first = tmp_path/'first'
    if not first.exists(): save_stats(_run(), first)
    shutil.copytree(first, tmp_path/name)
    return tmp_path/name

def _rewrite_npz(folder, change):
    "Rewrite `folder`'s arrays with `change(dict)` applied and its meta.json's size and sha256 updated (a consistent but wrong save)."
    import hashlib, io
    with np.load(folder/'recorders.npz', allow_pickle=False) as z: arrays = {k: z[k] for k in z.files}
    change(arrays)
    buf = io.BytesIO(); np.savez(buf, **arrays); data = buf.getvalue()
    (folder/'recorders.npz').write_bytes(data)
    meta = json.loads((folder/'meta.json').read_text())
    meta['arrays'].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (folder/'meta.json').write_text(json.dumps(meta))

def test_load_refuses_bad_folders(tmp_path):
    folder = _saved(tmp_path)
    def refused(path, *words, exc=ValueError):
        with pytest.raises(exc) as e: load_stats(path)
        msg = str(e.value)
        assert msg.startswith('load_stats: `path`') and all(w in msg for w in words) and '\n' not in msg, msg
    refused(tmp_path/'nowhere', 'does not exist')
    refused(folder/'meta.json', 'a regular file, not a folder')
    refused(42, 'must name a folder', exc=TypeError)
    link = tmp_path/'link'; link.symlink_to(folder)
    refused(link, 'a symlink')
    for name in ('meta.json', 'recorders.npz'):                     # one file missing, or a symlink to a good one
        other = _saved(tmp_path, f'without_{name}'); os.replace(other/name, tmp_path/name)
        refused(other, f'has no {name}')
        (other/name).symlink_to(tmp_path/name)
        refused(other, f'{name} is a symlink, not followed')
    meta = json.loads((folder/'meta.json').read_text())
    for change, words in [(dict(version=3), ['version 3', 'reads versions 1 and 2']), (dict(format='miniai.dumps'), ["format 'miniai.dumps'"]),
                          (dict(names=['a', 'a']), ['`names`']), (dict(recorders=[{'phase': 'test'}]), ['recorder 0'])]:
        bad = _saved(tmp_path, f'bad_{len(change)}_{next(iter(change))}')
        (bad/'meta.json').write_text(json.dumps({**meta, **change}))
        refused(bad, *words)
    bad = _saved(tmp_path, 'notjson'); (bad/'meta.json').write_text('{"format": ')
    refused(bad, 'meta.json is not JSON')
    bad = _saved(tmp_path, 'mixed'); save_stats(_forward_run(), tmp_path/'x'); os.replace(tmp_path/'x'/'recorders.npz', bad/'recorders.npz')
    refused(bad, 'recorders.npz is not the file its meta.json was written with')
    bad = _saved(tmp_path, 'shape'); _rewrite_npz(bad, lambda a: a.update(r0_rows=a['r0_rows'][:-1]))
    refused(bad, 'recorder conv.0.output (train)', '`n_batches`')
    bad = _saved(tmp_path, 'bins'); _rewrite_npz(bad, lambda a: a.update(r0_raw=a['r0_raw'][:, :-1]))
    refused(bad, 'bins+2')
    bad = _saved(tmp_path, 'dtype'); _rewrite_npz(bad, lambda a: a.update(r1_rows=a['r1_rows'].astype(np.float32)))
    refused(bad, 'r1_rows is float32, not float64')
    bad = _saved(tmp_path, 'gone'); _rewrite_npz(bad, lambda a: a.pop('r2_raw'))
    refused(bad, 'r2_raw is missing')
    bad = _saved(tmp_path, 'pickle'); _rewrite_npz(bad, lambda a: a.update(r0_rows=np.array([{'x': 1}], dtype=object)))
    refused(bad, 'r0_rows')
    assert load_stats(folder).names == ['conv.0', 'pair', 'count', 'head']   # the good one still loads

def test_save_refuses_bad_arguments(tmp_path):
    run = _run()
    target = tmp_path/'elsewhere'; target.mkdir()
    (tmp_path/'link').symlink_to(target)
    with pytest.raises(ValueError, match='symlink'): save_stats(run, tmp_path/'link')
    assert list(target.iterdir()) == []
    (tmp_path/'file').write_text('keep')
    with pytest.raises(ValueError, match='not a folder'): save_stats(run, tmp_path/'file')
    assert (tmp_path/'file').read_text() == 'keep'
    with pytest.raises(TypeError, match='`astats` must be an ActivationStats'): save_stats(nn.Linear(2, 2), tmp_path/'x')
    with pytest.raises(TypeError, match='`path` must name a folder'): save_stats(run, None)
    class Extra(Recorder):
        def after_record(self, f, row, m): pass
    run.recorders['train']['head']['output'] = Extra()
    with pytest.raises(ValueError, match='is a Extra, which keeps more'): save_stats(run, tmp_path/'extra')
    assert not (tmp_path/'extra').exists()

class MLP(nn.Sequential):
    def __init__(self): super().__init__(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))

def _forward_run(scale_last=1., nan_at=None, shift_at=None, every=1, n=6):
    "ActivationStats of `n` forwards (training mode, no update) of the same MLP on the same inputs: the last layer's weights times `scale_last`, a NaN in the input of batch `nan_at`, the input of batch `shift_at` shifted."
    torch.manual_seed(0)
    model = MLP()
    with torch.no_grad(): model[4].weight.mul_(scale_last)
    astats = ActivationStats(layers=['0', '2', '4'], every=every)
    g = torch.Generator().manual_seed(1)
    with astats.attach(model):
        for i in range(n):
            x = torch.randn(32, 8, generator=g)
            if i == nan_at: x[3, 2] = math.nan
            if i == shift_at: x = x + 0.5
            model(x)
    return astats

def test_two_runs_that_differ_in_one_layer_only():
    a, b = _forward_run(), _forward_run(scale_last=3.)
    rows = compare_stats(a, b)
    assert [r['layer'] for r in rows] == ['0', '2', '4']
    for r in rows[:2]:
        assert r['flags'] == ['same'] and r['first'] is None and r['batches'] == 6
        assert all(r[f'{s}_diff'] == 0 for s in ('mean', 'std', 'dead', 'overflow', 'nonfinite'))
    last = rows[2]
    assert last['flags'] == ['differs'] and last['first'] == 0
    ra, rb = a.series()['4'], b.series()['4']
    assert last['std_diff'] == float((rb.stds - ra.stds).abs().max()) > 0         # exactly the largest per-batch gap
    assert last['mean_a'] == float(ra.means.mean()) and last['std_b'] == float(rb.stds.mean())
    assert last['dead_diff'] == float((rb.dead - ra.dead).abs().max())
    table = str(rows)
    assert table.splitlines()[0].split()[:4] == ['layer', 'batches', 'std', 'A'] and table == format_comparison(rows)
    assert [l.split()[-1] for l in table.splitlines()[1:4]] == ['same', 'same', 'differs']

def test_the_first_differing_batch_and_nan():
    a, b = _forward_run(), _forward_run(shift_at=3)
    rows = compare_stats(a, b)
    assert [r['first'] for r in rows] == [3, 3, 3]
    assert all(r['nonfinite_diff'] == 0 for r in rows)
    c = _forward_run(nan_at=2)
    rows = compare_stats(a, c, labels=('clean', 'nan'))
    assert [r['first'] for r in rows] == [2, 2, 2]
    assert rows[0]['nonfinite_a'] == 0 and rows[0]['nonfinite_b'] == 16 and rows[0]['nonfinite_diff'] == 16   # one input row: 16 outputs
    assert 'std nan' in str(rows).splitlines()[0] and 'largest |nan - clean|' in str(rows)

def test_runs_with_other_every_and_lengths_compare_on_common_batches():
    a, b = _forward_run(), _forward_run(every=2)
    rows = compare_stats(a, b)
    assert all(r['flags'] == ['same', 'A every 1, B every 2: 3 batches in common'] and r['batches'] == 3 for r in rows)   # batches 0, 2, 4
    rows = compare_stats(b, a)
    assert all(r['flags'][0] == 'same' and r['batches'] == 3 and r['first'] is None for r in rows)
    c = _forward_run(every=2, shift_at=4)          # B's 3rd recorded batch is A's 5th (index 4)
    assert [r['first'] for r in compare_stats(a, c)] == [4, 4, 4] and [r['first'] for r in compare_stats(c, a)] == [2, 2, 2]
    short = _forward_run(n=4)
    rows = compare_stats(a, short)
    assert rows[0]['batches'] == 4 and rows[0]['flags'] == ['same', 'A recorded 6 batches, B 4: 4 compared']

def test_compare_layers_in_one_run_and_bad_arguments(tmp_path):
    a, b = _forward_run(), _forward_run()
    b.names, b.recorders['train'] = ['0', '2', 'x'], {'0': b.recorders['train']['0'], '2': b.recorders['train']['2'], 'x': {}}
    rows = compare_stats(a, b)
    assert [(r['layer'], r['flags']) for r in rows] == [('0', ['same']), ('2', ['same']), ('4', ['only in A']), ('x', ['only in B'])]
    assert math.isnan(rows[2]['std_diff']) and str(rows).splitlines()[3].split()[1:4] == ['0', '-', '-']
    assert [r['layer'] for r in compare_stats(a, b, layers=['2'])] == ['2']
    with pytest.raises(ValueError, match=r"`layers` names \['nope'\]"): compare_stats(a, b, layers=['nope'])
    with pytest.raises(ValueError, match='`phase`'): compare_stats(a, b, phase='test')
    with pytest.raises(ValueError, match='`labels`'): compare_stats(a, b, labels=('A',))
    with pytest.raises(TypeError, match='`b` must be an ActivationStats'): compare_stats(a, [1, 2])
    # saved folders compare as the runs do
    rows = compare_stats(save_stats(a, tmp_path/'a'), str(save_stats(_forward_run(scale_last=2.), tmp_path/'b')))
    assert [r['first'] for r in rows] == [None, None, 0]

def test_plot_compare_overlays_the_runs():
    a, b = _forward_run(), _forward_run(scale_last=3.)
    fig = plot_compare(a, b, layers=['2', '4'], labels=('base', 'scaled'))
    means, stds = fig.axes[:2]
    assert len(means.lines) == len(stds.lines) == 4 and [l.get_linestyle() for l in stds.lines] == ['-', '--', '-', '--']
    assert np.array_equal(stds.lines[3].get_ydata(), b.series()['4'].stds.numpy())
    assert [t.get_text() for t in stds.get_legend().get_texts()] == ['2', '4', 'base', 'scaled']
    assert len(plot_compare(a, b).axes[0].lines) == 6
    with pytest.raises(ValueError, match="`layers` names \\['1'\\]"): plot_compare(a, b, layers=['1'])
    plt.close('all')

def test_a_loaded_run_goes_to_tensorboard(tmp_path):
    pytest.importorskip('tensorboard')
    from miniai.tensorboard import TensorBoardCB
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = _run()
    loaded = load_stats(save_stats(run, tmp_path/'saved'))
    with TensorBoardCB(tmp_path/'tb', astats=loaded) as tb: assert tb.write() == 3 * 3 + 3 * 2   # 3 layers with a series ('count' is skipped)
    ea = EventAccumulator(str(tmp_path/'tb'), size_guidance={'scalars': 0, 'histograms': 0}); ea.Reload()
    stds = ea.Scalars('activations/head.output/std')
    assert [e.step for e in stds] == [0, 2, 4]                                     # every=2: training batches 0, 2, 4
    assert [e.value for e in stds] == [float(np.float32(v)) for v in run.series()['head'].stds.tolist()]
    assert len(ea.Scalars('activations_valid/head.output/std')) == 2


def test_the_earlier_option_name_works_warns_and_a_folder_saved_under_it_loads(tmp_path):
    "`grads=` is `output_grads=`'s earlier name: it records the same, with a DeprecationWarning naming the new one; a saved folder holds only the new name, and one whose settings hold the earlier name loads without a warning."
    import json, warnings
    from torch import nn
    with pytest.warns(DeprecationWarning, match='`grads` is now named `output_grads`'): old = ActivationStats(grads=True)
    assert old.output_grads and old.grads
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    with old.attach(m): m(torch.randn(2, 3)).sum().backward()
    assert len(old.recorders['train']['0']['output_grad']) == 1
    folder = old.save(tmp_path/'run')
    meta = json.loads((folder/'meta.json').read_text())
    assert meta['settings']['output_grads'] is True and 'grads' not in meta['settings']
    meta['settings']['grads'] = meta['settings'].pop('output_grads')         # a folder written when the option had its earlier name
    (folder/'meta.json').write_text(json.dumps(meta))
    with warnings.catch_warnings():
        warnings.simplefilter('error', DeprecationWarning)
        back = ActivationStats.load(folder)
    assert back.output_grads and torch.equal(back.recorders['train']['0']['output_grad'].means, old.recorders['train']['0']['output_grad'].means)
