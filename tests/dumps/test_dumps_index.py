"""One `index.json` schema for every folder miniai writes (dump folders, debugger pages): a header naming the format and
its version, then the items, one line each; indexes of version 1 (a dump folder's bare `{file: entry}`) still read."""
import json, os
import numpy as np, pytest, torch
from torch import nn
from miniai.dumps import SavingHook
from miniai.compare import DumpIndexError, compare_dumps, dump_index, load_dump
from miniai.debuggers import SequentialDebugger, load_pages

def _dump(root, scale=1.):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    with SavingHook(model, root, 'Linear') as h: (model(torch.randn(5, 4) * scale)).sum().backward()
    return h

def test_dump_index_has_the_header_and_one_line_per_file(tmp_path):
    h = _dump(tmp_path/'A')
    text = (h.tensor_dir/'index.json').read_text()
    index = json.loads(text)
    assert list(index) == ['format', 'version', 'files'] and (index['format'], index['version']) == ('miniai.dumps', 2)
    assert len(text.splitlines()) == len(index['files']) + 2 == 4                 # the header line, a line per file, the end
    entry = index['files'][sorted(index['files'])[0]]
    assert entry['source'] == 'output' and entry['layer_name'] == '0' and 'kind' not in entry
    grads = json.loads((h.grad_dir/'index.json').read_text())['files']
    assert {e['source'] for e in grads.values()} == {'param_grad'}
    assert dump_index(h.tensor_dir) == index['files']                             # lesson 10d reads the files

def test_version_1_dump_index_still_reads(tmp_path):
    "A dump folder written before the header: `{file: entry}`; its files, dtypes and comparisons are the same."
    a, b = _dump(tmp_path/'A'), _dump(tmp_path/'B')
    for h in (a, b):
        fn = h.tensor_dir/'index.json'
        fn.write_text(json.dumps(json.loads(fn.read_text())['files']))            # as version 1 wrote it
    files = dump_index(a.tensor_dir)
    assert len(files) == 2 and all(e['dtype'] == 'float32' for e in files.values())
    name = sorted(files)[0]
    assert load_dump(a.tensor_dir/name, tensor=True).dtype == torch.float32
    res = compare_dumps(tmp_path/'A', tmp_path/'B', progress=False, verbose=False)
    assert [len(r['compared']) for r in res.values()] == [2, 4] and all(not r['uncompared'] for r in res.values())

def test_an_index_of_another_format_is_refused(tmp_path):
    h = _dump(tmp_path/'A')
    (h.tensor_dir/'index.json').write_text(json.dumps({'format': 'miniai.debuggers.pages', 'version': 2, 'pages': []}))
    with pytest.raises(DumpIndexError, match="an index of miniai.debuggers.pages, not the files of a dump folder"): dump_index(h.tensor_dir)

CONFIG = [{'name': 'fm', 'debugger_config': {'class': 'FeatureMapDebugger', 'args': {'layer': '0'}}}]

def test_pages_index_shares_the_schema_and_is_written_once(tmp_path):
    model, x = nn.Sequential(nn.Linear(4, 3)), torch.randn(2, 4)
    sd = SequentialDebugger(100, CONFIG, path=tmp_path)
    sd({'inputs': x}, model); sd.flush()
    fn = tmp_path/'index.json'
    index = json.loads(fn.read_text())
    assert list(index)[:2] == ['format', 'version'] and (index['format'], index['version']) == ('miniai.debuggers.pages', 2)
    assert [p['json'] for p in index['pages']] == ['page_00000.json']
    before = os.stat(fn).st_ino
    sd.flush(); sd.flush()                                                        # nothing new: nothing written again
    assert os.stat(fn).st_ino == before and sorted(p.name for p in tmp_path.iterdir()) == ['index.json', 'page_00000.json', 'page_00000.npz']
    sd({'inputs': x}, model); sd.flush()                                          # a new page: a new index
    assert os.stat(fn).st_ino != before and len(json.loads(fn.read_text())['pages']) == 2
    assert len(load_pages(tmp_path)) == 2

def test_version_1_pages_index_still_reads(tmp_path):
    sd = SequentialDebugger(100, CONFIG, path=tmp_path)
    sd({'inputs': torch.randn(2, 4)}, nn.Sequential(nn.Linear(4, 3))); sd.flush()
    fn = tmp_path/'index.json'
    index = json.loads(fn.read_text()); index['version'] = 1
    fn.write_text(json.dumps(index, indent=1))                                    # as version 1 wrote it
    assert load_pages(tmp_path)[0]['results']['fm']['feature_map'].shape == (2, 3)
    fn.write_text(json.dumps({'format': 'miniai.dumps', 'version': 2, 'files': {}}))
    with pytest.raises(ValueError, match='not an index of debugger pages'): load_pages(tmp_path)
