"""miniai.dumps and miniai.compare across processes: two ranks under torchrun (gloo, CPU) write one folder each, and the
installed `miniai-compare` command writes one CSV per rank; bad arguments exit 2; scripts that end without removing
their hook; what `import miniai.compare` loads."""
import csv, json, os, subprocess, sys, textwrap
from pathlib import Path
from types import SimpleNamespace
import pytest
from _torchrun import run_two_ranks as torchrun_two_ranks

BIN = Path(sys.executable).parent
HEADER = ['tensor_name', 'cosine similarity', 'meanA', 'meanB', 'meanA - meanB', 'stdA', 'stdB', 'stdA - stdB',
          'varA', 'varB', 'varA - varB']

SCRIPT = textwrap.dedent('''
    import sys, torch, torch.distributed as dist
    from torch import nn
    from miniai.dumps import register_saving_hook
    dist.init_process_group('gloo')
    rank = dist.get_rank()
    torch.manual_seed(0)
    for out, scale in [(sys.argv[1], 1.0), (sys.argv[2], 1.1)]:   # two runs, B with inputs scaled by 1.1
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        model = register_saving_hook(model, out, 'Linear', max_saved_tensors=-1, max_saved_grads=-1)
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        torch.manual_seed(100 + rank)
        for step in range(2):
            x = torch.randn(4, 6) * scale
            ddp(x).pow(2).mean().backward()
            opt.step(); opt.zero_grad()
        model.saving_hook.remove()
        dist.barrier()
    dist.destroy_process_group()
''')

def compare_cmd():
    exe = BIN/'miniai-compare'
    return [str(exe)] if exe.exists() else [sys.executable, '-m', 'miniai.compare']

def run_two_ranks(tmp_path, run_a, run_b):
    script = tmp_path/'dump_run.py'
    script.write_text(SCRIPT)
    res = torchrun_two_ranks(script, run_a, run_b, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]

def test_two_ranks_dump_and_compare(tmp_path, capsys):
    run_a, run_b = tmp_path/'A', tmp_path/'B'
    run_two_ranks(tmp_path, run_a, run_b)
    for run in (run_a, run_b):
        for kind, n in [('tensors', 4), ('grads', 8)]:   # 2 Linear outputs x 2 steps; 4 params x 2 steps
            for rank in (0, 1):
                files = sorted((run/kind/f'rank_{rank}').glob('*.npy'))
                assert len(files) == n, (run, kind, rank, files)
                assert all(f.name.startswith('tensor_idx_') and '_micro_step_' in f.name for f in files)
    res = subprocess.run([*compare_cmd(), '--pathA', str(run_a), '--pathB', str(run_b), '--no-progress'],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for kind, n in [('tensors', 4), ('grads', 8)]:
        csvs = sorted(p.name for p in (run_a/kind/'compare_rst').iterdir())
        assert csvs == ['rank_0_rst.csv', 'rank_0_uncompared.csv', 'rank_1_rst.csv', 'rank_1_uncompared.csv'], csvs
        for name in ['rank_0_rst.csv', 'rank_1_rst.csv']:
            with open(run_a/kind/'compare_rst'/name, newline='') as f: rows = list(csv.reader(f))
            assert rows[0][:11] == HEADER
            assert len(rows) == 1 + n
            assert all(float(c) == float(c) or c == 'nan' for r in rows[1:] for c in r[1:]), rows   # numbers only
        for rank in (0, 1):   # no errors, nothing in one run only
            assert (run_a/kind/'compare_rst'/f'rank_{rank}_uncompared.csv').read_text() == 'tensor_name,reason\n'
    # the first layer's output on each rank differs only by the input scale (and a bias): cosine near 1
    with open(run_a/'tensors'/'compare_rst'/'rank_1_rst.csv', newline='') as f: first = next(csv.DictReader(f))
    assert 0.95 < float(first['cosine similarity']) <= 1.0 + 1e-12, first
    # a threshold the scaled run cannot meet exits 1 (`compare_main` in this process: the command's code up to `sys.exit`)
    from miniai.compare import compare_main
    with pytest.raises(SystemExit) as e: compare_main(['--pathA', str(run_a), '--pathB', str(run_b), '--no-progress', '--max-abs-err', '0'])
    assert e.value.code == 1, capsys.readouterr()

@pytest.mark.parametrize('args,as_command', [(['--pathA', '.'], True), (['--pathA', '/nonexistent/dump', '--pathB', '.'], False)])
def test_cli_bad_args(args, as_command, capsys):
    "The installed command (a process: its exit status) and `compare_main` in this process (the same code up to `sys.exit`)."
    if as_command: res = subprocess.run([*compare_cmd(), *args], capture_output=True, text=True, timeout=60)
    else:
        from miniai.compare import compare_main
        with pytest.raises(SystemExit) as e: compare_main(args)
        res = SimpleNamespace(returncode=e.value.code, **dict(zip(('stdout', 'stderr'), capsys.readouterr())))
    assert res.returncode == 2, res.stdout + res.stderr
    assert 'usage: miniai-compare' in res.stderr

@pytest.fixture(scope='module')
def exit_run(tmp_path_factory):
    "One script, for the two tests below (a Python that imports torch takes seconds): model `kept` never removes its hook; model `removed` removes it by hand, then its folder is deleted."
    tmp = tmp_path_factory.mktemp('exit')
    script = tmp/'no_cleanup.py'
    script.write_text(textwrap.dedent('''
        import sys, shutil, torch
        from pathlib import Path
        from torch import nn
        from miniai.dumps import register_saving_hook
        root = Path(sys.argv[1])
        model = register_saving_hook(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)), root/'kept', 'Linear', -1, -1)
        for _ in range(3): model(torch.randn(64, 4)).sum().backward()
        other = register_saving_hook(nn.Sequential(nn.Linear(4, 4)), root/'removed', 'Linear', -1, -1)
        other(torch.randn(8, 4)).sum().backward()
        other.saving_hook.remove()
        shutil.rmtree(root/'removed')
    '''))
    res = subprocess.run([sys.executable, str(script), str(tmp/'dump')], capture_output=True, text=True, timeout=60,
                         env={**os.environ, 'OMP_NUM_THREADS': '1'})
    return res, tmp/'dump'

def test_atexit_flushes(exit_run):
    "A script that never removes its hook still leaves every file and the index on disk when it exits."
    res, dump = exit_run
    assert res.returncode == 0, res.stderr[-3000:]
    folder = dump/'kept'/'tensors'/'rank_0'
    assert len(list(folder.glob('*.npy'))) == 6
    assert len(list((dump/'kept'/'grads'/'rank_0').glob('*.npy'))) == 12
    assert (folder/'index.json').exists() and not list(folder.glob('*.tmp'))

def test_removed_hook_is_not_flushed_at_exit(exit_run):
    "A hook removed by hand whose folder is then deleted: nothing happens at exit (no second flush, no traceback, the folder stays gone)."
    res, dump = exit_run
    assert res.returncode == 0 and res.stderr == '', res.stderr
    assert not (dump/'removed').exists()

def run_script(tmp_path, body):
    script = tmp_path/'script.py'
    script.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script), str(tmp_path/'dump')], capture_output=True, text=True, timeout=60,
                          env={**os.environ, 'OMP_NUM_THREADS': '1'})

def test_unremoved_hook_with_folder_gone_is_one_line(tmp_path):
    "A hook never removed whose folder is deleted before exit: one line on stderr, no traceback, the script's own exit status."
    res = run_script(tmp_path, '''
        import sys, shutil, torch
        from torch import nn
        from miniai.dumps import register_saving_hook
        model = register_saving_hook(nn.Sequential(nn.Linear(4, 4)), sys.argv[1], 'Linear', -1, -1, background=True)
        model(torch.randn(8, 4)).sum().backward()
        shutil.rmtree(sys.argv[1])
    ''')
    assert res.returncode == 0, res.stderr
    assert 'Traceback' not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert 'could not write everything at exit' in res.stderr

def test_long_names_and_register_twice_keep_every_tensor(tmp_path):
    "A 200-character layer name is saved (its temporary name stays under 255 bytes too); a second registration replaces the first, with a warning, and the first hook's files are all on disk (here, before any exit)."
    import warnings, torch
    from torch import nn
    from miniai.dumps import register_saving_hook
    model = nn.Sequential()
    model.add_module('x'*200, nn.Linear(4, 4))
    model = register_saving_hook(model, tmp_path/'dump'/'first', 'Linear', -1, -1)
    model(torch.randn(8, 4)).sum().backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        model = register_saving_hook(model, tmp_path/'dump'/'second', 'Linear', -1, -1)
    assert len(caught) == 1 and str(caught[0].message).startswith('register_saving_hook: this model already had a saving hook'), caught
    model(torch.randn(8, 4)).sum().backward()
    model.saving_hook.remove()
    for run in ('first', 'second'):
        folder = tmp_path/'dump'/run
        assert len(list((folder/'tensors'/'rank_0').glob('*.npy'))) == 1
        assert len(list((folder/'grads'/'rank_0').glob('*.npy'))) == 2
        assert all(len(p.name.encode()) <= 200 for p in folder.rglob('*.npy'))
        assert not list(folder.rglob('*.tmp'))

# --- layers through hooks.select_modules, the shared basics, the direct write of new files ----------------------------

@pytest.mark.parametrize('keyword', ['layers', 'target_class_names'])
def test_layer_name_typo_gives_close_match(tmp_path, keyword):
    "`layers=` and its other name `target_class_names=`: a typo is a LayerNotFoundError (and a ValueError) naming the close match, and creates nothing."
    from torch import nn
    from miniai.dumps import register_hook, register_saving_hook
    from miniai.hooks import LayerNotFoundError
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))
    for register in (register_hook, register_saving_hook):
        with pytest.raises(LayerNotFoundError, match="closest class names: 'Conv2d'") as e:
            register(model, path=tmp_path/'d', **{keyword: ['Conv2D']})
        assert isinstance(e.value, ValueError) and 'match no module' in str(e.value)
    assert not (tmp_path/'d').exists() and not hasattr(model, 'saving_hook')

def test_default_layers_are_leaves_with_parameters(tmp_path):
    "`layers=None` is `default_layers`: every leaf module that holds parameters, frozen ones included (their outputs; only trainable parameters have gradients)."
    import torch
    from torch import nn
    from miniai.dumps import register_saving_hook
    from miniai.compare import dump_index
    model = nn.Sequential(nn.Embedding(5, 4), nn.LayerNorm(4), nn.ReLU(), nn.Sequential(nn.Linear(4, 2)))
    model[1].requires_grad_(False)
    model = register_saving_hook(model, tmp_path, max_saved_tensors=-1, max_saved_grads=-1)
    assert [h.name for h in model.saving_hook.hooks] == ['0', '1', '3.0'] and model.saving_hook.layers is None
    model(torch.tensor([[1, 2]])).sum().backward()
    model.saving_hook.remove()
    assert {v['layer_name'] for v in dump_index(tmp_path/'tensors'/'rank_0').values()} == {'0', '1', '3.0'}
    assert {v['layer_name'] for v in dump_index(tmp_path/'grads'/'rank_0').values()} == {'0.weight', '3.0.weight', '3.0.bias'}

def test_hooks_named_from_named_modules_and_modules_untouched(tmp_path):
    "Hooks carry the qualified names; the user's modules get no attribute (only the documented `model.saving_hook`, until `remove()`)."
    import torch
    from torch import nn
    from miniai.dumps import register_saving_hook
    from miniai.compare import dump_index
    inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model = nn.Sequential(inner)
    before = {n: set(vars(m)) for n, m in model.named_modules()}
    model = register_saving_hook(model, tmp_path, 'Linear', -1, -1)
    assert [h.name for h in model.saving_hook.hooks] == ['0.0', '0.2']
    model(torch.randn(3, 4)).sum().backward()
    attached = {n: set(vars(m)) for n, m in model.named_modules()}
    assert attached[''] - before[''] == {'saving_hook'} and all(attached[n] == before[n] for n in before if n)
    model.saving_hook.remove()
    assert {n: set(vars(m)) for n, m in model.named_modules()} == before   # remove() takes `model.saving_hook` away too
    layers = {v['layer_name'] for v in dump_index(tmp_path/'tensors'/'rank_0').values()}
    assert layers == {'0.0', '0.2'}

def test_save_npy_new_file_and_replace(tmp_path):
    "A new file is written in place (same bytes as np.save, no temporary); an existing one is replaced atomically; a symlink is never written through."
    import numpy as np, torch
    from miniai.dumps import save_npy
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    save_npy(tmp_path/'a.npy', torch.from_numpy(arr)); np.save(tmp_path/'ref.npy', arr)
    assert (tmp_path/'a.npy').read_bytes() == (tmp_path/'ref.npy').read_bytes()
    save_npy(tmp_path/'a.npy', arr*2)                                   # the name exists: replaced
    assert (np.load(tmp_path/'a.npy', allow_pickle=False) == arr*2).all()
    target = tmp_path/'outside.npy'; target.write_bytes(b'keep')
    (tmp_path/'link.npy').symlink_to(target)
    save_npy(tmp_path/'link.npy', arr)
    assert target.read_bytes() == b'keep' and not (tmp_path/'link.npy').is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['a.npy', 'link.npy', 'outside.npy', 'ref.npy']

@pytest.fixture(scope='module')
def after_import():
    "What a fresh Python holds once it has imported miniai.compare (what `miniai-compare` does first): one process for the tests below."
    code = ('import json, sys, miniai.compare; print(json.dumps({"miniai": sorted(m for m in sys.modules if m.startswith("miniai")), '
            '"heavy": [m for m in ("torchvision", "datasets", "fastprogress", "matplotlib") if m in sys.modules], "numba": "numba" in sys.modules}))')
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)

def test_compare_startup_stays_light(after_import):
    "Importing miniai.compare (what `miniai-compare` does) loads miniai's core and kernel (its Moments and Recorder, and the passes they run) only: not the saving hook, the learner, the hooks, the datasets or the progress bar."
    assert after_import['miniai'] == ['miniai', 'miniai.compare', 'miniai.core', 'miniai.kernel', 'miniai.passes'], after_import
    assert after_import['heavy'] == [], after_import

def test_compare_startup_does_not_compile_the_kernel(after_import):
    "Importing miniai.compare loads the statistics kernel's Python module only: numba is imported (and the loops compiled or loaded) at the first comparison."
    assert after_import['numba'] is False, after_import
