"""The FashionMNIST cache heals itself: half-built, corrupt and concurrently built caches, on the real data.
The data is the first 2,000 training and 500 test images of Debian's files, as IDX files of their own (MINIAI_DATA), so that
every rebuild goes through the whole path, reading IDX to decoding, at a 30th of the cost. The cache is built once per
module in a temporary MINIAI_CACHE; each test breaks its own copy of it."""
import os, re, shutil, subprocess, sys, warnings
from pathlib import Path
import numpy as np, pytest
import miniai.datasets as mds

repo = Path(__file__).parents[2]
pytestmark = pytest.mark.skipif(not mds.debian_fashion_path.exists(), reason="needs Debian's dataset-fashion-mnist")

ROWS = {'train': 2000, 'test': 500}

@pytest.fixture(scope='module')
def data(tmp_path_factory):
    "A folder with the first `ROWS` images and labels of each split of Debian's FashionMNIST, as gzipped IDX files."
    d = tmp_path_factory.mktemp('fashion')
    for split, n in ROWS.items():
        for f in mds._fashion_files[split]: mds.write_idx(d/f, mds.read_idx(mds.debian_fashion_path/f)[:n])
    return d

@pytest.fixture(scope='module')
def built(data, tmp_path_factory):
    "A cache folder holding the Arrow cache and the decoded images, built once from `data`."
    cache = tmp_path_factory.mktemp('cache')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('MINIAI_CACHE', str(cache)); mp.setenv('MINIAI_DATA', str(data))
        mds.tensor_dd(mds.load_fashion_mnist())
    return cache

@pytest.fixture
def cache(built, data, tmp_path, monkeypatch):
    "This test's own copy of the built cache, as MINIAI_CACHE, reading `data`."
    c = tmp_path/'cache'
    shutil.copytree(built, c)
    monkeypatch.setenv('MINIAI_CACHE', str(c)); monkeypatch.setenv('MINIAI_DATA', str(data))
    return c

def dest_of(cache): return next(p for p in cache.glob('fashion_mnist-v*') if p.is_dir() and '.' not in p.name)

def load_warns(*parts, f=mds.load_fashion_mnist):
    "Call `f`, expecting one miniai warning that contains every string in `parts`; return its result."
    with pytest.warns(UserWarning, match='miniai: ') as record: res = f()
    msgs = [str(w.message) for w in record if str(w.message).startswith('miniai: ')]
    assert len(msgs) == 1, msgs
    for part in parts: assert str(part) in msgs[0], (part, msgs[0])
    return res

def check_next_load(cache):
    "The next load is silent, has all the rows and labels 0-9, and leaves no leftovers beside the cache."
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter('always')
        dd = mds.load_fashion_mnist()
        tds = mds.tensor_dd(dd)
    assert not [w for w in record if 'miniai' in str(w.message)], [str(w.message) for w in record]
    assert (dd['train'].num_rows, dd['test'].num_rows) == (ROWS['train'], ROWS['test'])
    for split in ('train', 'test'):
        assert sorted(np.unique(dd[split].data.column('label').to_numpy())) == list(range(10))
        assert tds[split].tensors['image'].shape[1:] == (28, 28)
    assert len(tds['train']) == ROWS['train'] and len(tds['test']) == ROWS['test']
    assert [p.name for p in cache.glob('fashion_mnist-v*') if p.is_dir()] == [dest_of(cache).name]

def test_manifest_is_strict_json_with_checksums(cache):
    dest = dest_of(cache)
    text = (dest/'miniai_manifest.json').read_text()
    manifest = mds._strict_json(text)
    assert manifest['rows'] == ROWS
    arrow = manifest['files']['train/data-00000-of-00001.arrow']
    assert arrow['size'] == (dest/'train/data-00000-of-00001.arrow').stat().st_size and len(arrow['sha256']) == 64
    with pytest.raises(ValueError, match='NaN'): mds._strict_json('{"a": NaN}')

def test_half_built(cache):
    "A build killed half-way: a temporary folder left beside the cache, and a cache folder without its manifest or test split."
    dest = dest_of(cache)
    shutil.copytree(dest/'train', cache/f'{dest.name}.tmp4242'/'train')
    (dest/'miniai_manifest.json').unlink(); shutil.rmtree(dest/'test')
    load_warns(dest, 'never finished', 'rebuilding')
    assert not (cache/f'{dest.name}.tmp4242').exists()
    check_next_load(cache)

def test_leftovers_only(cache):
    "Only the temporary folder of an interrupted build: it is named, removed, and the cache is rebuilt."
    dest = dest_of(cache)
    shutil.move(dest, cache/f'{dest.name}.tmp4242')
    load_warns(f'{dest.name}.tmp4242', cache, 'rebuilding')
    check_next_load(cache)

def test_truncated_arrow(cache):
    dest = dest_of(cache)
    arrow = dest/'train'/'data-00000-of-00001.arrow'
    with open(arrow, 'r+b') as f: f.truncate(arrow.stat().st_size // 2)
    load_warns(dest, 'train/data-00000-of-00001.arrow', 'truncated')
    check_next_load(cache)

def test_bad_state_json(cache):
    dest = dest_of(cache)
    (dest/'test'/'state.json').write_text('{"_data_files": [')
    load_warns(dest, 'test/state.json')
    check_next_load(cache)

def test_flipped_byte_found_by_verify(cache):
    "A same-size change in an Arrow file passes the cheap checks; `verify=True` checksums every file and rebuilds."
    dest = dest_of(cache)
    arrow = dest/'test'/'data-00000-of-00001.arrow'
    with open(arrow, 'r+b') as f:
        f.seek(arrow.stat().st_size // 2); b = f.read(1); f.seek(-1, 1); f.write(bytes([b[0] ^ 0xff]))
    load_warns(dest, 'sha256', f=lambda: mds.load_fashion_mnist(verify=True))
    check_next_load(cache)

def test_truncated_decoded_npy(cache):
    npys = sorted((cache/'decoded').glob('*.npy'), key=lambda p: p.stat().st_size)
    train_npy = npys[-1]
    with open(train_npy, 'r+b') as f: f.truncate(train_npy.stat().st_size - 1000)
    dd = mds.load_fashion_mnist()
    tds = load_warns(train_npy, 'decoding them again', f=lambda: mds.tensor_dd(dd))
    assert len(tds['train']) == ROWS['train']
    check_next_load(cache)

_child = """
from miniai.datasets import load_fashion_mnist, tensor_dd
tds = tensor_dd(load_fashion_mnist())
print(len(tds['train']), len(tds['test']), sorted(set(tds['train'].tensors['label'].tolist())))
"""

def test_two_processes_build_at_once(data, tmp_path):
    "Two processes started together on an empty cache: one builds, the other waits for it; both load the same copy."
    env = {**os.environ, 'MINIAI_CACHE': str(tmp_path/'cache'), 'PYTHONPATH': f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env['MINIAI_DATA'] = str(data)
    procs = [subprocess.Popen([sys.executable, '-c', _child], env=env, cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert out.strip() == f"{ROWS['train']} {ROWS['test']} {list(range(10))}", (out, err[-2000:])
        assert 'miniai: ' not in err, err   # nothing was broken, so nothing to warn about
    cache = tmp_path/'cache'
    assert [p.name for p in cache.iterdir() if p.is_dir() and p.name != 'decoded'] == [dest_of(cache).name]
    assert not list((cache/'decoded').glob('*.tmp*'))

def test_miniai_data_empty_folder(cache, data, tmp_path, monkeypatch):
    empty = tmp_path/'empty'; empty.mkdir()
    monkeypatch.setenv('MINIAI_DATA', str(empty))
    with pytest.raises(FileNotFoundError) as e: mds.load_fashion_mnist()
    msg = str(e.value)
    for part in ('MINIAI_DATA', str(empty), 'train-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz', 'unset MINIAI_DATA'): assert part in msg, part
    monkeypatch.setenv('MINIAI_DATA', str(data))
    check_next_load(cache)

def test_path_with_missing_files(cache, tmp_path):
    half = tmp_path/'half'; half.mkdir()
    for f in mds._fashion_files['train']: shutil.copy(mds.debian_fashion_path/f, half/f)
    with pytest.raises(FileNotFoundError) as e: mds.load_fashion_mnist(half)
    msg = str(e.value)
    assert f"path={str(half)!r}" in msg and 'does not hold' in msg
    assert re.search(r"missing \['t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'\]", msg), msg
    assert 'train-images' not in msg.split('missing')[1]
    check_next_load(cache)

_hub_child = """
import datasets
dd = datasets.load_dataset('fashion_mnist')
print(dd['train'].num_rows, dd['test'].num_rows, dd['train'].features['label'].num_classes)
"""

def test_load_dataset_offline_after_add_to_hf_cache(built, data, tmp_path, monkeypatch):
    "`datasets.load_dataset('fashion_mnist')` in a fresh offline process finds the copy `add_to_hf_cache` prepared."
    monkeypatch.setenv('MINIAI_CACHE', str(built)); monkeypatch.setenv('MINIAI_DATA', str(data))
    hf_cache = tmp_path/'hf'
    folder = mds.add_to_hf_cache(cache_dir=str(hf_cache))
    assert folder.relative_to(hf_cache).parts[0] == 'fashion_mnist'
    env = {**os.environ, 'HF_DATASETS_CACHE': str(hf_cache), 'HF_HOME': str(tmp_path/'home'), 'HF_DATASETS_OFFLINE': '1', 'HF_HUB_OFFLINE': '1'}
    res = subprocess.run([sys.executable, '-c', _hub_child], env=env, cwd=tmp_path, text=True, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == [str(ROWS['train']), str(ROWS['test']), '10']
