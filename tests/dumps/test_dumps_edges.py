"""miniai.dumps' saving hook at its edges: a hooked model deep-copies and saves (and nothing of the hook stays on it after
`remove`), `paused_recording()` saves nothing, `if_exists='new_run'` gives every run its own folder even when several
start at once, bad limits are refused at construction, and the user's tensors stay bit-identical on both kernel paths."""
import copy, gc, io, json, math, os, subprocess, sys, textwrap, threading, time, weakref
from unittest import mock
from pathlib import Path
import numpy as np, pytest, torch
from torch import nn
from miniai import kernel
from miniai.core import paused_recording
from miniai.dumps import SavingHook, register_saving_hook

def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).to(dtype)

def _step(model, dtype=torch.float32):
    x = torch.randn(5, 4, dtype=dtype, generator=torch.Generator().manual_seed(1))
    model(x).pow(2).sum().backward()

def _counts(h):
    h.flush()
    return len(list(h.tensor_dir.glob('*.npy'))), len(list(h.grad_dir.glob('*.npy')))

def _no_hooks_left(model):
    return (not model._forward_pre_hooks and all(not m._forward_hooks for m in model.modules())
            and all(not p._backward_hooks for p in model.parameters()))

@pytest.mark.parametrize('background', [False, True])
def test_hooked_model_deepcopies_and_saves(tmp_path, background):
    model = register_saving_hook(_model(), tmp_path/'d', 'Linear', -1, -1, save_output_grads=True, background=background)
    h = model.saving_hook
    _step(model)
    assert _counts(h) == (2, 6)                      # 2 outputs, 4 parameter grads and 2 output grads
    buf = io.BytesIO(); torch.save(model, buf); buf.seek(0)
    copies = [copy.deepcopy(model), torch.load(buf, weights_only=False)]
    for c in copies:
        assert c.saving_hook is None
        for p, q in zip(model.parameters(), c.parameters()): assert torch.equal(p, q) and p is not q
        _step(c)                                       # the copies record nothing...
    assert _counts(h) == (2, 6) and h.micro_step == 0
    _step(model)                                       # ...and the original keeps saving
    assert _counts(h) == (4, 12) and h.micro_step == 1
    ref = weakref.ref(h)
    h.remove(); del h
    gc.collect()
    assert ref() is None, "the removed SavingHook is still reachable"
    assert not hasattr(model, 'saving_hook') and _no_hooks_left(model)
    buf = io.BytesIO(); torch.save(model, buf); buf.seek(0)
    for c in [copy.deepcopy(model), torch.load(buf, weights_only=False)]:
        assert _no_hooks_left(c) and not hasattr(c, 'saving_hook')
    assert len(list((tmp_path/'d'/'tensors'/'rank_0').glob('*.npy'))) == 4

def test_paused_recording_saves_nothing(tmp_path):
    model = register_saving_hook(_model(), tmp_path, 'Linear', -1, -1, save_output_grads=True)
    h = model.saving_hook
    _step(model)
    with paused_recording():
        _step(model); _step(model)                     # e.g. a debugger's own GradCAM pass
    assert _counts(h) == (2, 6) and h.micro_step == 0
    _step(model)                                       # the next real step is micro step 1, not 3
    h.remove()
    steps = {e['micro_step'] for e in json.loads((h.tensor_dir/'index.json').read_text())['files'].values()}
    assert steps == {0, 1} and _counts(h) == (4, 12)

def _make_run(root, n):
    d = root/f'run_{n}'/'tensors'/'rank_0'; d.mkdir(parents=True); (d/'x.npy').write_bytes(b'')

def test_new_run_takes_the_next_number_after_the_highest(tmp_path):
    _make_run(tmp_path, 0); _make_run(tmp_path, 2)
    with SavingHook(_model(), tmp_path, 'Linear', if_exists='new_run') as h: pass
    assert h.path == tmp_path/'run_3'
    with SavingHook(_model(), tmp_path, 'Linear', if_exists='new_run') as h2: pass
    assert h2.path == tmp_path/'run_4'
    (tmp_path/'run_5').write_text('a file in the way')
    with SavingHook(_model(), tmp_path, 'Linear', if_exists='new_run') as h3: pass
    assert h3.path == tmp_path/'run_6'

def test_new_run_threads_started_at_once_get_their_own_folder(tmp_path):
    n, barrier, paths, errors = 8, threading.Barrier(8), [], []
    def run():
        barrier.wait()
        try:
            with SavingHook(_model(), tmp_path, 'Linear', if_exists='new_run') as h: paths.append(h.path)
        except Exception as e: errors.append(repr(e))
    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors and sorted(paths) == sorted(tmp_path/f'run_{i}' for i in range(n))

NEW_RUN = textwrap.dedent('''
    import os, sys, time, torch
    from torch import nn
    from miniai.dumps import SavingHook
    go = sys.argv[2]
    open(go + f'.ready{os.getpid()}', 'w').close()
    while not os.path.exists(go): time.sleep(0.001)
    model = nn.Sequential(nn.Linear(3, 2))
    with SavingHook(model, sys.argv[1], 'Linear', if_exists='new_run') as h:
        model(torch.ones(1, 3)).sum().backward()
    print(h.path.name)
''')

def test_new_run_processes_started_at_once_get_their_own_folder(tmp_path):
    script, go = tmp_path/'new_run.py', tmp_path/'go'
    script.write_text(NEW_RUN)
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path/'dumps'), str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(4)]
    deadline = time.time() + 120
    while len(list(tmp_path.glob('go.ready*'))) < 4 and time.time() < deadline and all(p.poll() is None for p in procs): time.sleep(0.01)
    go.touch()                                        # all four imported torch and wait: release them at once
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    assert sorted(o[0].strip() for o in outs) == ['run_0', 'run_1', 'run_2', 'run_3']
    for i in range(4): assert len(list((tmp_path/'dumps'/f'run_{i}'/'tensors'/'rank_0').glob('*.npy'))) == 1

@pytest.mark.parametrize('arg', ['max_saved_tensors', 'max_saved_grads'])
@pytest.mark.parametrize('value', [math.nan, 2.5, 10.0, '10', None, True, math.inf])
def test_bad_limits_are_refused_at_construction(tmp_path, arg, value):
    with pytest.raises(TypeError, match=f'^{arg} must be a whole number'):
        SavingHook(_model(), tmp_path/'d', 'Linear', **{arg: value})
    assert not (tmp_path/'d').exists()                # refused before anything was created

@pytest.mark.parametrize('kwargs, exc, match', [
    (dict(queue_size=0), ValueError, 'queue_size must be at least 1'),
    (dict(queue_size=2.0), TypeError, 'queue_size must be a whole number'),
    (dict(buffer_mb=math.nan), ValueError, 'buffer_mb must be a finite number > 0'),
    (dict(buffer_mb=-1), ValueError, 'buffer_mb must be a finite number > 0'),
    (dict(buffer_mb='64'), TypeError, 'buffer_mb must be a number'),
    (dict(save_output_grads='yes'), TypeError, 'save_output_grads must be True or False'),
    (dict(background=1), TypeError, 'background must be None, True or False'),
    (dict(path=None), TypeError, 'path must name a folder'),
    (dict(path=''), TypeError, 'path must name a folder')])
def test_other_bad_arguments_name_themselves(tmp_path, kwargs, exc, match):
    with pytest.raises(exc, match=match): SavingHook(_model(), **{'path': tmp_path/'d', 'layers': 'Linear', **kwargs})
    assert not (tmp_path/'d').exists()

def test_bad_limit_keeps_the_registered_hook(tmp_path):
    model = register_saving_hook(_model(), tmp_path/'a', 'Linear', -1, -1)
    with pytest.raises(TypeError, match='max_saved_grads'): register_saving_hook(model, tmp_path/'b', 'Linear', 3, '10')
    h = model.saving_hook
    assert not h.closed and not (tmp_path/'b').exists()
    _step(model); h.remove()
    assert _counts(h) == (2, 4)
    with SavingHook(_model(), tmp_path/'c', 'Linear', np.int64(3)) as h3: assert h3.max_saved_tensors == 3   # numpy ints are whole numbers

def _bits(t): return t.detach().contiguous().view(torch.uint8 if t.element_size() == 1 else {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]).clone()

def _run(dtype, hook_path=None, background=False):
    "Outputs, output grads, input grad and parameter grads of one step, as bits (and the hook, if any)."
    model = _model(dtype)
    x = (torch.arange(20, dtype=torch.float64).reshape(5, 4)/7 - 1).to(dtype).t().contiguous().t().requires_grad_()
    x0 = _bits(x)
    h = SavingHook(model, hook_path, 'Linear', -1, -1, save_output_grads=True, background=background) if hook_path else None
    outs = []
    def keep(m, i, o): o.retain_grad(); outs.append(o)
    handles = [m.register_forward_hook(keep) for m in model if isinstance(m, nn.Linear)]
    loss = model(x).float().pow(2).sum()
    loss.backward()
    if h: h.remove()
    for hd in handles: hd.remove()
    assert torch.equal(_bits(x), x0)
    return h, [_bits(t) for t in [x, x.grad, loss, *outs, *[o.grad for o in outs], *[p.grad for p in model.parameters()]]]

@pytest.mark.parametrize('fused', [True, False])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_user_tensors_stay_bit_identical(tmp_path, dtype, fused):
    with mock.patch.dict(os.environ, MINIAI_KERNEL='loops' if fused else 'torch'):
        _, ref = _run(dtype)
        for background in (False, True):
            h, got = _run(dtype, tmp_path/f'bg{background}', background)
            assert len(got) == len(ref) and all(torch.equal(a, b) for a, b in zip(ref, got))
            out0 = np.load(h.tensor_dir/next(n for n in os.listdir(h.tensor_dir) if n.startswith('tensor_idx_0_')), allow_pickle=False)
            assert torch.equal(_bits(torch.from_numpy(out0).to(dtype)), ref[3])   # the file holds the output, bit for bit
