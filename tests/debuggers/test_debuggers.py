"""What the 10c notebook cannot check: the installed module's class lookup, pages read by another process, a failed write."""
import json, subprocess, sys
import numpy as np, pytest, torch
from torch import nn
import miniai.debuggers as dbg
from miniai.debuggers import *
from miniai.debuggers import load_pages, build_debugger, SequentialDebugger, DebugCB   # miniai.sequential's, read from miniai.debuggers
# helpers the tests reach into (not in `__all__`: a user does not call them)
from miniai.debuggers import channel_dims, encode_records, find_module, finite_mean_std, nbytes, read_index
from miniai.findings import judge

def toy():
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU()), nn.Sequential(nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU()),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))

CONFIG = [{'name': 'fm', 'debugger_config': {'class': 'FeatureMapDebugger', 'args': {'layer': '1'}}},
          {'name': 'cam', 'debugger_config': {'class': 'miniai.debuggers.GradCAMDebugger', 'args': {'layer': '1'}}}]

def test_class_by_name_and_dotted_path():
    sd = SequentialDebugger(1, CONFIG)
    assert [type(d).__name__ for d in sd.debuggers.values()] == ['FeatureMapDebugger', 'GradCAMDebugger']
    with pytest.raises(ValueError, match='must be a BaseDebugger'): build_debugger({'class': 'torch.nn.Linear', 'args': {}})
    with pytest.raises(ValueError, match='must be a BaseDebugger'): build_debugger({'class': 'NoSuchDebugger'})

def test_config_never_imports(tmp_path, monkeypatch):
    "A dotted name in a config is looked up among the debuggers already defined: the module is not imported, its code does not run."
    (tmp_path/'evil_mod.py').write_text(f"open({str(tmp_path/'ran')!r}, 'w').close()\nclass X: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match='nothing is imported'): build_debugger({'class': 'evil_mod.X'})
    assert not (tmp_path/'ran').exists() and 'evil_mod' not in sys.modules
    class MyDebugger(dbg.ForwardDebugger): pass   # a user's own debugger, once defined, is found by its dotted path
    assert dbg._resolve_class(f'{__name__}.test_config_never_imports.<locals>.MyDebugger', 'x') is MyDebugger

def test_pages_read_in_another_process(tmp_path):
    model, x = toy(), torch.randn(4, 1, 8, 8)
    with SequentialDebugger(0.001, CONFIG, path=tmp_path) as sd:
        for i in range(3): sd({'inputs': x, 'outputs': None}, model, batch=i)
    assert len(sd.pages) == 3
    code = ("import json, sys, numpy as np\n"
            "idx = json.load(open(sys.argv[1] + '/index.json'))\n"
            "page = idx['pages'][-1]\n"
            "arrs = np.load(sys.argv[1] + '/' + page['npz'], allow_pickle=False)\n"
            "rec = json.load(open(sys.argv[1] + '/' + page['json']))['records'][0]\n"
            "print(json.dumps({'batch': rec['batch'], 'shape': list(arrs[rec['results']['cam']['gradcam']['__array__']].shape)}))")
    out = subprocess.run([sys.executable, '-c', code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {'batch': 2, 'shape': [4, 8, 8]}

def test_failed_write_loses_nothing(tmp_path, monkeypatch):
    model, x = toy(), torch.randn(4, 1, 8, 8)
    sd = SequentialDebugger(100, CONFIG, path=tmp_path)
    sd({'inputs': x, 'outputs': None}, model)
    sd.flush()
    sd({'inputs': x, 'outputs': None}, model, batch=1)
    def boom(f, **arrays):
        f.write(b'half a page'); raise OSError('disk full')
    monkeypatch.setattr(dbg.np, 'savez', boom)
    with pytest.raises(OSError, match='disk full'): sd.flush()
    assert len(sd.buffer) == 1                                   # still buffered
    assert sorted(p.name for p in tmp_path.iterdir()) == ['index.json', 'page_00000.json', 'page_00000.npz']   # no partial file
    assert len(load_pages(tmp_path)) == 1
    monkeypatch.undo()
    sd.flush()
    assert [r.get('batch') for r in load_pages(tmp_path)] == [None, 1]

def test_page_names_cannot_escape(tmp_path):
    (tmp_path/'index.json').write_text(json.dumps({'pages': [{'json': '../x.json', 'npz': 'p.npz'}]}))
    with pytest.raises(ValueError, match='outside its folder'): load_pages(tmp_path)

# --- outputs a debugger cannot describe, NaN in pages, folders that cannot be written ---
import math, os, shutil, tempfile
from pathlib import Path
import torch.nn.functional as F
from miniai.learner import Learner, TrainCB, Callback
from miniai.datasets import DataLoaders

def no_constants(name): raise ValueError(f'not strict JSON: {name}')

class Const(nn.Module):
    def __init__(self, value): super().__init__(); self.value = value
    def forward(self, x): return self.value

FORWARD = [FeatureMapDebugger, AttentionDebugger, ActivationStatsDebugger, LayerOutputDebugger]
BAD = {'None': (None, 'not a tensor (got NoneType)'), 'int': (3, 'not a tensor (got int)'),
       'empty': (torch.zeros(2, 0, 4), 'empty tensor of shape [2, 0, 4]'),
       'complex': (torch.ones(2, 3, dtype=torch.complex64), 'complex dtype')}

@pytest.mark.parametrize('kind', BAD)
@pytest.mark.parametrize('cls', FORWARD, ids=lambda c: c.__name__)
def test_unusable_outputs_give_an_error_dict(cls, kind):
    value, msg = BAD[kind]
    res = cls('0')({'inputs': None}, nn.Sequential(Const(value)))
    assert set(res) == {'error'} and msg in res['error'], res

@pytest.mark.parametrize('cls', FORWARD, ids=lambda c: c.__name__)
def test_all_nan_output_is_reported_and_written_as_strict_json(cls, tmp_path):
    model = nn.Sequential(Const(torch.full((2, 3, 4, 4), math.nan)))
    res = cls('0')({'inputs': None}, model)
    stats = res.get('stats') or res.get('activation_stats')
    if stats is not None:
        assert stats['nonfinite'] == 96 and math.isnan(stats['mean']) and 'all 96 values are NaN or Inf' in stats['warning']
        assert stats['findings'] == judge('0', nonfinite=96, total=96)
    with SequentialDebugger(100, [{'name': 'd', 'debugger_config': {'class': cls, 'args': {'layer': '0'}}}], path=tmp_path) as sd:
        sd({'inputs': None}, model)
    for name in ['index.json'] + [p['json'] for p in read_index(tmp_path)['pages']]:
        json.loads((tmp_path/name).read_text(), parse_constant=no_constants)
    back = load_pages(tmp_path)[0]['results']['d']
    if stats is not None:
        back_stats = back.get('stats') or back.get('activation_stats')
        assert math.isnan(back_stats['mean']) and not any(k.endswith('_reason') for k in back_stats)

def test_nan_in_lists_round_trips(tmp_path):
    x = torch.randn(2, 3, 4, 4); x[:, 1] = math.nan; x[0, 0, 0, 0] = -math.inf
    model = nn.Sequential(Const(x))
    with SequentialDebugger(100, [{'name': 's', 'debugger_config': {'class': ActivationStatsDebugger, 'args': {'layer': '0'}}}], path=tmp_path) as sd:
        res = sd({'inputs': None}, model)
    page = json.loads((tmp_path/'page_00000.json').read_text(), parse_constant=no_constants)
    written = page['records'][0]['results']['s']
    assert written['activation_stats']['channel_means'][1] is None and written['activation_stats']['channel_means_reason'] == {'nan': [1]}
    assert written['sample_values'][0] is None and written['sample_values_reason']['-inf'] == [0]
    back = load_pages(tmp_path)[0]['results']['s']
    np.testing.assert_equal(back['activation_stats']['channel_means'], res['s']['activation_stats']['channel_means'])
    np.testing.assert_equal(back['sample_values'], res['s']['sample_values'])

def test_index_is_strict_json_with_an_infinite_page_size(tmp_path):
    sd = SequentialDebugger(math.inf, CONFIG, path=tmp_path)
    sd({'inputs': torch.randn(2, 1, 8, 8)}, toy())
    sd.flush()
    index = json.loads((tmp_path/'index.json').read_text(), parse_constant=no_constants)
    assert index['page_size_mb'] is None and index['page_size_mb_reason'] == 'inf'
    assert len(load_pages(tmp_path)) == 1

def test_process_forward_errors_do_not_stop_training():
    class Broken(dbg.ForwardDebugger):
        def process_forward(self, module, input, output): raise RuntimeError('oops')
    res = Broken('1')({'inputs': torch.randn(2, 1, 8, 8)}, toy())
    assert res == {'error': "Broken.process_forward failed on the output of '1': RuntimeError: oops"}

def test_gradcam_on_model_outputs_it_cannot_use():
    for value, msg in ((None, 'got NoneType'), (3, 'got int')):
        res = GradCAMDebugger('0')({'inputs': torch.randn(2, 1, 4, 4)}, nn.Sequential(nn.Identity(), Const(value)))
        assert msg in res['error'], res

def toy_dls(n=32, bs=8):
    ds = list(zip(torch.randn(n, 1, 8, 8), torch.randint(0, 3, (n,))))
    return DataLoaders(torch.utils.data.DataLoader(ds, bs), torch.utils.data.DataLoader(ds, bs))

def n_hooks(model): return sum(len(m._forward_hooks) for m in model.modules())

def test_debugcb_unwritable_folder_fails_before_training(tmp_path):
    model = toy()
    before = [p.detach().clone() for p in model.parameters()]
    (tmp_path/'file').write_text('x')
    folder = tmp_path/'file'/'pages'
    with pytest.raises(OSError, match=f"cannot write its pages to the folder '{folder}'"):
        Learner(model, toy_dls(), F.cross_entropy, cbs=[TrainCB(), DebugCB(SequentialDebugger(100, CONFIG, path=folder))]).fit(1)
    assert n_hooks(model) == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))     # nothing trained

def test_debugcb_cleanup_removes_hooks_before_it_writes(tmp_path):
    "The last flush fails in the cleanup stage (the folder went away): the hooks are gone first, the records stay buffered."
    model = toy()
    sd = SequentialDebugger(100, CONFIG, path=tmp_path/'pages')
    hooks_at_flush = []
    real_flush = sd.flush
    def flush():
        hooks_at_flush.append(n_hooks(model))
        return real_flush()
    sd.flush = flush
    class Break(Callback):
        order = DebugCB.order + 1
        def after_predict(self, learn):
            if learn.iter == 0: (tmp_path/'pages').rmdir(); (tmp_path/'pages').write_text('not a folder')
    with pytest.raises(OSError, match=f"folder '{tmp_path/'pages'}'.*2 records are still buffered"):
        Learner(model, toy_dls(), F.cross_entropy, cbs=[TrainCB(), DebugCB(sd, batches=(0, 1)), Break()]).fit(1)
    assert hooks_at_flush == [0] and n_hooks(model) == 0 and len(sd.buffer) == 2
    sd.path = tmp_path/'again'
    sd.flush()
    assert [r['iter'] for r in load_pages(tmp_path/'again')] == [0, 1]

@pytest.mark.skipif(os.name != 'posix' or not Path('/usr/bin/setpriv').exists(), reason='needs setpriv to drop root')
def test_debugcb_read_only_folder_as_another_user():
    "A folder the user may not write to (run as `nobody` when we are root, since root writes anywhere)."
    base = Path(tempfile.mkdtemp(dir='/tmp')); base.chmod(0o755)   # where `nobody` can reach it (pytest's folders are root's alone); removed below
    try:
        folder = base/'pages'; folder.mkdir(); folder.chmod(0o555)
        code = ("import torch, torch.nn.functional as F, sys\n"
                "from torch import nn\n"
                "from miniai.learner import Learner, TrainCB\n"
                "from miniai.datasets import DataLoaders\n"
                "from miniai.debuggers import DebugCB, SequentialDebugger\n"
                "model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())\n"
                "ds = list(zip(torch.randn(8, 1, 6, 6), torch.randint(0, 2, (8,))))\n"
                "dls = DataLoaders(torch.utils.data.DataLoader(ds, 4), torch.utils.data.DataLoader(ds, 4))\n"
                "sd = SequentialDebugger(100, [{'name': 'f', 'debugger_config': {'class': 'FeatureMapDebugger', 'args': {'layer': '0'}}}], path=sys.argv[1])\n"
                "try: Learner(model, dls, F.cross_entropy, cbs=[TrainCB(), DebugCB(sd)]).fit(1)\n"
                "except PermissionError as e: print('ERROR', e)\n"
                "print('HOOKS', sum(len(m._forward_hooks) for m in model.modules()))\n")
        cmd = [sys.executable, '-c', code, str(folder)]
        if os.geteuid() == 0: cmd = ['/usr/bin/setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', *cmd]
        root = Path(dbg.__file__).parent.parent
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=base, env={**{k: v for k, v in os.environ.items() if not k.endswith('_CACHE_DIR')}, 'PYTHONPATH': str(root), 'HOME': str(base), 'TMPDIR': str(base)})   # nobody cannot reach pytest's folders (torch puts its cache folder, under them, in the environment)
        if 'HOOKS' not in res.stdout: pytest.skip(f'cannot run as nobody here: {res.stderr[-300:]!r}')
        assert f"ERROR [Errno 13] SequentialDebugger cannot write its pages to the folder '{folder}'" in res.stdout, res.stdout
        assert 'HOOKS 0' in res.stdout and os.listdir(folder) == []
    finally: shutil.rmtree(base)

# --- one vocabulary: `layer` picked by `select_modules`, the document's `layer_name`/`target_layer` as other names, `every_epoch` for epochs
import inspect, warnings
from miniai.hooks import LayerNotFoundError as HooksLayerNotFoundError, LayerNotFoundError

def test_find_module_is_select_modules_by_name_or_class():
    model = toy()
    assert find_module(model, '1.0') is model[1][0] and dbg.LayerNotFoundError is HooksLayerNotFoundError
    assert find_module(model, 'Linear') is model[4] and find_module(model, '') is model      # the class of one layer; the model itself
    with pytest.raises(LayerNotFoundError, match=r"target_layer: '1\.00' is neither a layer name nor a class name.*closest layer names: '1\.0'"):
        find_module(model, '1.00', arg='target_layer')
    with pytest.raises(LayerNotFoundError, match=r"layer: 'Conv2d' is the class of 2 layers, \['0\.0', '1\.0'\]; a debugger watches one"):
        find_module(model, 'Conv2d')
    with pytest.raises(TypeError, match='layer must be a layer name'): find_module(model, model[1])
    with FeatureMapDebugger('1.0').attach(model) as d: assert d.hook.name == '1.0'
    assert not any(hasattr(m, '_hook_name') for m in model.modules())

ONE_LAYER = [FeatureMapDebugger, AttentionDebugger, ActivationStatsDebugger, LayerOutputDebugger, GradCAMDebugger]

@pytest.mark.parametrize('cls', ONE_LAYER, ids=lambda c: c.__name__)
@pytest.mark.parametrize('other', ['layer_name', 'target_layer'])
def test_layer_takes_the_documents_names(cls, other):
    "`layer_name`/`target_layer` work as keywords and as attributes, read and written; the signature shows only `layer`."
    d = cls(**{other: '1'})
    assert d.layer == '1' and getattr(d, other) == '1' and repr(d).startswith(f"{cls.__name__}('1'")
    setattr(d, other, '1.0')
    assert d.layer == '1.0'
    params = list(inspect.signature(cls).parameters)
    assert params[0] == 'layer' and 'layer_name' not in params and 'target_layer' not in params
    with pytest.raises(TypeError, match=f'`{other}` is another name for `layer`'): cls(layer='1', **{other: '1'})

def test_documents_config_and_subclass_names():
    "A config with the document's argument names, and a subclass that reads `self.layer_name` as the document's examples do."
    class Named(dbg.ForwardDebugger):
        def process_forward(self, module, input, output): return {'layer_name': self.layer_name, 'shape': list(output.shape)}
    sd = SequentialDebugger(100, [{'name': 'n', 'debugger_config': {'class': Named, 'args': {'layer_name': '1'}}},
                                  {'name': 'fm', 'debugger_config': {'class': 'FeatureMapDebugger', 'args': {'layer_name': '1'}}},
                                  {'name': 'cam', 'debugger_config': {'class': 'GradCAMDebugger', 'args': {'target_layer': '1'}}}])
    res = sd({'inputs': torch.randn(2, 1, 8, 8)}, toy())
    assert res['n'] == {'layer_name': '1', 'shape': [2, 8, 4, 4]}
    assert res['fm']['layer_name'] == '1' and res['cam']['target_layer'] == '1'      # the results keep the document's keys

def test_base_debugger_defines_collect_or_call():
    class Nothing(dbg.BaseDebugger): pass
    with pytest.raises(NotImplementedError, match='Nothing must define `collect` or `__call__`'): Nothing()({'inputs': None}, toy())
    class Called(dbg.BaseDebugger):      # the document's pattern: a `__call__` returning host results
        def __call__(self, datapoint, model): return {'n': int(datapoint['inputs'].shape[0])}
    sd = SequentialDebugger(100, [{'name': 'c', 'debugger_config': {'class': Called}}])
    assert sd({'inputs': torch.randn(3, 1, 8, 8)}, toy()) == {'c': {'n': 3}}

def test_small_map_is_kept_unpooled_with_a_finding():
    res = LayerOutputDebugger('0', downsample_factor=4)({'inputs': None}, nn.Sequential(Const(torch.ones(2, 3, 2, 2))))
    assert res['output'].shape == (2, 3, 2, 2)
    [f] = res['findings']
    assert (f['layer'], f['issue'], f['measure'], f['threshold']) == ('0', 'not pooled', 'downsample_factor', 4)
    assert 'smaller than downsample_factor=4' in res['warning']

def test_debugcb_counts_epochs_with_every_epoch():
    sd = SequentialDebugger(100, CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert DebugCB(sd, every_epoch=3).every_epoch == 3 and DebugCB(sd, 3).every_epoch == 3
    with pytest.raises(TypeError, match="'every'"): DebugCB(sd, every=2)      # in miniai `every` counts batches
    assert DebugCB(sd, on_val=True).on_valid is True and DebugCB(sd, on_valid=True).on_val is True
    assert DebugCB.from_config({'checkpoint_method': 4, 'debugger': {'class': 'SequentialDebugger', 'args': {'debuggers_config': CONFIG}}}).every_epoch == 4
    with pytest.raises(ValueError, match='every_epoch'): DebugCB(sd, every_epoch=0)

def test_debugcb_every_epoch_picks_epochs(tmp_path):
    model = toy()
    sd = SequentialDebugger(100, CONFIG[:1], path=tmp_path)
    Learner(model, toy_dls(), F.cross_entropy, cbs=[TrainCB(), DebugCB(sd, every_epoch=2)]).fit(4)
    assert [(r['epoch'], r['iter']) for r in load_pages(tmp_path)] == [(1, 0), (3, 0)]

def test_nbytes_and_unknown_values():
    assert nbytes({'x': torch.zeros(3, dtype=torch.float64), 'a': np.zeros(2, 'f4'), 's': 'abc', 'n': [1, None]}) == 24 + 8 + 3 + 16
    with pytest.raises(TypeError, match='debugger results must be tensors'): encode_records({'dev': torch.device('cpu')})

# --- the statistics come from the kernel's `Moments` (batch_moments / row_moments): structured inputs against numpy float64 ---
from miniai.kernel import use_kernel, row_moments
from miniai.testing import count_syncs

def np_stats(x):
    "numpy float64 statistics of the finite values of tensor `x`: centred on the first finite value and scaled by a power of two (both exact)."
    r = x.detach().double().numpy().ravel()
    f = r[np.isfinite(r)]
    c = f - f[0]
    k = 2. ** -np.frexp(np.abs(c).max())[1] if np.abs(c).max() > 0 else 1.
    return dict(mean=f[0] + (c*k).mean()/k, std=(c*k).std(ddof=1)/k, min=f.min(), max=f.max(), nonfinite=r.size - f.size,
                l1=np.abs(f).mean(), l2=np.linalg.norm(f / np.abs(f).max()) * np.abs(f).max(), top=np.abs(f).max())

def structured_inputs():
    g = torch.Generator().manual_seed(0)
    col = torch.randn(4, 6, 5, 5, generator=g); col[:, 2] = math.nan                      # a channel of NaN
    every = torch.randn(4, 6, 5, 5, generator=g); every.view(-1)[::7] = math.nan; every.view(-1)[3::7] = -math.inf
    return {'nan column': col, 'nan every 7th': every,
            'constant large': torch.full((4, 6, 5, 5), -12345.678e30),
            'large mean': 1e4 + 1e-3 * torch.randn(4, 6, 5, 5, generator=g),
            'large mean f64': 1e12 + torch.randn(4, 6, 5, 5, generator=g, dtype=torch.float64),
            'beyond float32': 1e100 * torch.randn(4, 6, 5, 5, generator=g, dtype=torch.float64)}

STRUCTURED = structured_inputs()

@pytest.mark.parametrize('fused', [True, False], ids=['fused', 'torch'])
@pytest.mark.parametrize('name', list(STRUCTURED))
def test_stats_match_numpy_float64(name, fused):
    x = STRUCTURED[name]
    want = np_stats(x)
    with use_kernel('loops' if fused else 'torch'):
        fm = FeatureMapDebugger('0')({'inputs': None}, nn.Sequential(Const(x)))['stats']
        st = ActivationStatsDebugger('0')({'inputs': None}, nn.Sequential(Const(x)))['activation_stats']
    for s in (fm, st):
        assert s['nonfinite'] == want['nonfinite'] and s['min'] == want['min'] and s['max'] == want['max']
        assert abs(s['mean'] - want['mean']) <= 1e-15 * want['top'], (s['mean'], want['mean'])
        if name == 'constant large': assert s['std'] == 0
        else: assert abs(s['std'] - want['std']) <= 1e-9 * want['std'], (s['std'], want['std'])
    assert abs(st['l1_norm'] - want['l1']) <= 1e-12 * want['top']
    assert abs(st['l2_norm'] - want['l2']) <= 1e-12 * want['l2']
    assert st['sparsity'] == float((x == 0).double().mean())
    r = x.double().numpy().copy(); r[~np.isfinite(r)] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        means, stds = np.nanmean(r, axis=(0, 2, 3)), np.nanstd(r - np.nanmax(r), axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(st['channel_means'], means, rtol=1e-12)
    np.testing.assert_allclose(st['channel_stds'], stds, rtol=1e-9, atol=0)

@pytest.mark.parametrize('fused', [True, False], ids=['fused', 'torch'])
def test_feature_map_std_large_mean_and_constant(fused):
    x = 1000 + 0.01 * torch.randn(8, 16, 32, 32, generator=torch.Generator().manual_seed(0))
    with use_kernel('loops' if fused else 'torch'):
        st = FeatureMapDebugger('0')({'inputs': None}, nn.Sequential(Const(x)))['stats']
        const = FeatureMapDebugger('0')({'inputs': None}, nn.Sequential(Const(torch.full((8, 16, 32, 32), 12345.678))))['stats']
    ref = x.numpy().astype(np.float64)
    assert abs(st['std'] / ref.std(ddof=1) - 1) < 1e-6 and 0.0099 < st['std'] < 0.0101, st['std']
    assert abs(st['mean'] - ref.mean()) < 1e-9
    assert const['std'] == 0. and const['mean'] == const['min'] == const['max'] == float(np.float32(12345.678))

@pytest.mark.parametrize('fused', [True, False], ids=['fused', 'torch'])
def test_channel_stats_both_row_paths(fused):
    "Channel statistics of a 3-d output (many short rows): the compiled loop and the torch ops agree, and both agree with numpy."
    g = torch.Generator().manual_seed(1)
    x = 1e6 + torch.randn(5, 40, 30, generator=g, dtype=torch.float64); x[:, 3, 4] = math.nan; x[0, 7, 2] = math.inf; x[:, 9, 9] = 2.5
    a = x.permute(1, 2, 0).reshape(1200, 5)
    with use_kernel('loops' if fused else 'torch'): mean, std = finite_mean_std(x, channel_dims(x))
    with use_kernel('loops'): k = row_moments(a)
    with use_kernel('torch'): v = row_moments(a)
    for f in ('count', 'nan', 'posinf', 'neginf', 'min', 'max'): assert torch.equal(getattr(k, f), getattr(v, f)), f
    torch.testing.assert_close(v.mean, k.mean, rtol=1e-15, atol=0, equal_nan=True)
    torch.testing.assert_close(v.m2, k.m2, rtol=1e-9, atol=1e-20, equal_nan=True)
    assert v.m2[9*30 + 9] == 0 and k.m2[9*30 + 9] == 0 and mean[9, 9] == 2.5 and std[9, 9] == 0
    assert math.isnan(mean[3, 4]) and math.isnan(std[3, 4]) and std[7, 2].isnan() == False
    r = x.numpy().copy(); r[~np.isfinite(r)] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        np.testing.assert_allclose(mean.numpy(), np.nanmean(r, 0), rtol=1e-15)
        np.testing.assert_allclose(std.numpy(), np.nanstd(r - 1e6, 0, ddof=1), rtol=1e-9)

@pytest.mark.parametrize('fused', [True, False], ids=['fused', 'torch'])
def test_stat_hooks_do_not_sync(fused):
    model = toy()
    x = torch.randn(2, 1, 8, 8)
    dbgs = [FeatureMapDebugger('0.0'), ActivationStatsDebugger('1.0'), ActivationStatsDebugger('1')]
    with use_kernel('loops' if fused else 'torch'):
        for d in dbgs: d.attach(model)
        try:
            with count_syncs() as cs: model(x)
        finally:
            for d in dbgs: d.remove()
    assert cs.n == 0, cs.ops
    for d in dbgs: assert 'error' not in d.pop()
