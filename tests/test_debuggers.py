"""What the 10c notebook cannot check: the installed module's class lookup, pages read by another process, a failed write."""
import json, subprocess, sys
import numpy as np, pytest, torch
from torch import nn
import miniai.debuggers as dbg
from miniai.debuggers import *

def toy():
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU()), nn.Sequential(nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU()),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3))

CONFIG = [{'name': 'fm', 'debugger_config': {'class': 'FeatureMapDebugger', 'args': {'layer_name': '1'}}},
          {'name': 'cam', 'debugger_config': {'class': 'miniai.debuggers.GradCAMDebugger', 'args': {'target_layer': '1'}}}]

def test_class_by_name_and_dotted_path():
    sd = SequentialDebugger(1, CONFIG)
    assert [type(d).__name__ for d in sd.debuggers.values()] == ['FeatureMapDebugger', 'GradCAMDebugger']
    with pytest.raises(ValueError, match='must be a BaseDebugger'): build_debugger({'class': 'torch.nn.Linear', 'args': {}})
    with pytest.raises(ValueError, match='must be a BaseDebugger'): build_debugger({'class': 'NoSuchDebugger'})

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
