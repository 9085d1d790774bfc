"""A cold start (#30): while numba compiles the kernel's loops, a `Recorder` keeps a copy of each CPU tensor (about one read
and one write, instead of the torch ops' several float64 passes) and passes the copies, in order, once the loops are ready
or a read asks for them. Checked here by putting the kernel in its compiling state: the numbers are bit for bit those of a
recorder that never waited, the user's tensors are never touched, the copies stay within their cap, and nothing leaks."""
import gc, contextlib, weakref
import pytest, torch
import miniai.kernel as K
from miniai.kernel import Recorder, fused_kernel

@contextlib.contextmanager
def compiling():
    "The kernel as it is while its loops compile in the background: started, not ready, not failed."
    saved = dict(K._LOOPS)
    K._LOOPS.clear(); K._LOOPS.update(started=True, cached=False)
    try: yield
    finally: K._LOOPS.clear(); K._LOOPS.update(saved)

def batches(n=6, seed=0):
    "Structured batches: columns of other scales, a head unlike the tail, a strided view, NaN and Inf, float32 and float64."
    g = torch.Generator().manual_seed(seed)
    res = []
    for i in range(n):
        x = torch.randn(64, 300, generator=g) * torch.logspace(-3, 3, 300)
        x[0, :7] = 1e6
        if i % 3 == 1: x = x.t()                       # not contiguous
        if i % 3 == 2: x = x.double(); x[5, 5] = float('nan'); x[6, 6] = float('inf')
        res.append(x)
    return res

def bits(rec):
    sd = rec.state_dict()
    return sd['rows'].view(torch.int64), sd['raw'], rec.hists

def same(a, b):
    for x, y in zip(bits(a), bits(b)): assert torch.equal(x, y)

def warm():
    with fused_kernel(True): Recorder().record(torch.ones(4))     # the loops loaded before the kernel is set back to compiling

def test_kept_tensors_are_passed_by_the_loops_in_order_bit_for_bit():
    warm()
    xs, ref = batches(), Recorder(minmax=True, zeros=True, seed=3)
    for x in xs: ref.record(x)
    rec = Recorder(minmax=True, zeros=True, seed=3)
    with compiling():
        for x in xs: rec.record(x)
        assert len(rec) == len(xs) and len(rec._kept) == len(xs) and all(r is None for r in rec._rows)   # kept in their slots, not passed
        for x in xs: x.mul_(0)                                                      # the user's tensors change: the copies do not
    same(rec, ref)                       # the read passes them, with the loops now ready
    assert not rec._kept and rec._kept_bytes == 0

def test_a_read_while_compiling_takes_the_torch_ops_as_without_the_loops():
    warm()
    xs = batches(4, seed=1)
    with fused_kernel(False):
        ref = Recorder(seed=5)
        for x in xs: ref.record(x)
    rec = Recorder(seed=5)
    with compiling():
        for x in xs[:2]: rec.record(x)
        rec.means                        # a read now: the kept two pass through the torch ops
        assert not rec._kept
        for x in xs[2:]: rec.record(x)   # kept again
        assert len(rec._kept) == 2
        same(rec, ref)

def test_the_copies_stay_within_their_cap_and_order_holds(monkeypatch):
    warm()
    xs = batches(5, seed=2)
    one = xs[0].numel() * 4
    held = sum(r._kept_bytes for r in K._KEEPING)     # copies other recorders of this process may hold (a loaded machine's slow first load)
    monkeypatch.setattr(K, '_KEEP_CAP', held + 2 * one)
    with fused_kernel(False):
        ref = Recorder(seed=1)
        for x in xs: ref.record(x)
    rec, other = Recorder(seed=1), Recorder(seed=1)
    with compiling():
        rec.record(xs[0]); other.record(xs[0])          # the cap counts every recorder's copies
        assert rec._kept_bytes == one and len(other._kept) == 1
        for x in xs[1:]: rec.record(x)                 # over the cap: the torch ops record into the later slots,
        assert sum(r._kept_bytes for r in K._KEEPING) <= K._KEEP_CAP
        kept = [slot for *_, slot in rec._kept]
        assert kept and kept[0] == 0 and all((r is None) == (i in kept) for i, r in enumerate(rec._rows))   # while the kept wait (no stall)
        same(rec, ref)
    gone = weakref.ref(other)
    del other; gc.collect()
    assert gone() is None and gone not in [weakref.ref(r) for r in K._KEEPING]     # a recorder dropped with its copy: nothing left held
    assert rec._kept_bytes == 0 and sum(r._kept_bytes for r in K._KEEPING) <= held   # `rec`'s were passed by the read above

def test_a_folding_recorder_keeps_and_folds_in_order():
    "`fold=True` (run-wide): kept slots are passed before any fold, and the folded row equals that of a recorder that never waited."
    warm()
    xs = [torch.randn(300, generator=torch.Generator().manual_seed(i)) * (i + 1) + i for i in range(7)]
    ref = Recorder(fold=True, minmax=True, zeros=True)
    ref.fold_every = 3
    for x in xs: ref.record(x)
    rec = Recorder(fold=True, minmax=True, zeros=True)
    rec.fold_every = 3
    with compiling():
        for x in xs: rec.record(x)
        assert len(rec._kept) == 7 and rec._folded is None
    assert torch.equal(rec.total.t.view(torch.int64), ref.total.t.view(torch.int64)) and not rec._kept

def test_over_the_cap_a_folding_recorder_waits_to_fold_rather_than_pass_the_copies(monkeypatch):
    "Over the cap, a `fold=True` recorder records new batches by the torch ops and folds nothing while copies wait (folding would pass them through the torch ops: a stall); read, every count, min and max is exact and the moments agree to rounding."
    warm()
    xs = [torch.randn(300, generator=torch.Generator().manual_seed(i)) * (i + 1) + i for i in range(7)]
    held = sum(r._kept_bytes for r in K._KEEPING)
    monkeypatch.setattr(K, '_KEEP_CAP', held + 2 * 300 * 4)
    ref = Recorder(fold=True, minmax=True, zeros=True)
    for x in xs: ref.record(x)
    rec = Recorder(fold=True, minmax=True, zeros=True)
    rec.fold_every = 3
    with compiling():
        for x in xs: rec.record(x)
        assert len(rec._kept) == 2 and rec._folded is None and len(rec._rows) == 7     # no fold, no pass
    a, b = rec.total.to_dict(), ref.total.to_dict()
    assert not rec._kept
    for k in ('count', 'nan', 'posinf', 'neginf', 'zeros', 'low', 'high', 'min', 'max'): assert a[k] == b[k], k
    assert a['mean'] == pytest.approx(b['mean'], rel=1e-12) and a['std'] == pytest.approx(b['std'], rel=1e-12)

def test_what_keeps_nothing():
    "The torch ops chosen (`fused_kernel(False)`), a subclass (it may read its own state per record), a device tensor: no copies."
    warm()
    class Sub(Recorder):
        def after_record(self, f, row, m): self.seen = True
    x = torch.randn(1000)
    with compiling():
        with fused_kernel(False):
            r = Recorder(); r.record(x); assert not r._kept and len(r._rows) == 1
        s = Sub(); s.record(x); assert not s._kept and s.seen
        r = Recorder()
        with torch.inference_mode(): r.record(x)       # kept in inference mode, passed outside it
        assert len(r._kept) == 1
    assert len(r.means) == 1 and not r._kept

def test_state_dict_and_loading_drop_or_pass_the_copies():
    warm()
    xs = batches(3, seed=4)
    ref = Recorder(seed=2)
    for x in xs: ref.record(x)
    rec = Recorder(seed=2)
    with compiling():
        for x in xs: rec.record(x)
    sd = rec.state_dict()                              # passes the kept ones first
    assert sd['n_batches'] == 3 and not rec._kept
    same(rec, ref)
    other = Recorder(seed=2)
    with compiling(): other.record(xs[0])
    other.load_state_dict(ref.state_dict())            # replaced: the copy goes
    assert not other._kept and other._kept_bytes == 0 and len(other) == 3

class _Waits(type(K._COMPILED)):
    "A not-yet-set `threading.Event` that notes how long each caller offered to wait for the loops."
    def __init__(self): super().__init__(); self.asked = []
    def wait(self, timeout=None): self.asked.append(timeout); return False

def test_a_cached_load_keeps_a_plain_recorders_tensors_and_makes_only_others_wait(monkeypatch):
    "While numba's cache loads, a plain `Recorder` (and a sketch's, which replays in order) keeps its tensor, no wait; a subclass with per-record state of its own waits for the load, at most `_FIRST_WAIT`."
    warm()
    from miniai.sketch import SketchRecorder
    class Sub(Recorder):
        def after_record(self, f, row, m): self.seen = True
    x = batches(1)[0]
    waits = _Waits()
    monkeypatch.setattr(K, '_COMPILED', waits)
    with compiling():
        K._LOOPS['cached'] = True
        rec = Recorder(seed=1); rec.record(x)
        sk = SketchRecorder(); sk.record(x)
        assert len(rec._kept) == len(sk._kept) == 1 and waits.asked == [0, 0]     # kept, nothing waited for
        Sub().record(x)
        assert waits.asked == [0, 0, K._FIRST_WAIT]                                # the subclass offered to wait for the load
    ref = Recorder(seed=1); ref.record(x)
    same(rec, ref)

def test_a_collector_stream_keeps_and_replays_in_order_bit_for_bit():
    "The collector's streams (a sketch's sample per batch, an exact buffer, per-channel rows) keep their tensors while the loops compile; passed later, in order, every number is that of a stream that never waited."
    warm()
    from miniai.statistics import _Stream
    xs = [x.float() for x in batches(6, seed=7)]
    def stream():
        s = _Stream('cpu', level=0, max_samples=60_000)
        s.sample = 1024           # most batches sampled (19200 values each)
        return s
    ref = stream()
    for x in xs: ref.update(x)
    s = stream()
    with compiling():
        for x in xs: s.update(x)
        assert len(s._kept) == len(xs) and s.sketch.counts.sum() == 0          # kept: nothing sampled yet
        for x in xs: x.mul_(0)                                                 # the user's tensors change: the copies do not
    s.flush()
    assert not s._kept
    assert ref.sketch.counts.sum() > 0 and (s.buf is None) == (ref.buf is None) and s.filled == ref.filled
    for a, b in ((s.total.t, ref.total.t), (s.sketch.counts, ref.sketch.counts), (s.sampling, ref.sampling)):
        assert torch.equal(a.view(torch.int64), b.view(torch.int64))

def test_making_the_recorders_starts_the_loops_unless_the_torch_ops_are_chosen(monkeypatch):
    "`ActivationStats` and the collector get the loops ready when they are made (`prepare_loops`), not inside the first training step; not when the torch ops are chosen."
    import miniai.activations as A, miniai.statistics as S
    started = []
    monkeypatch.setattr(K, '_start_compiling', lambda: started.append(1))
    with compiling():
        del K._LOOPS['started']
        A.ActivationStats(); assert started == [1]
        S.ActivationStatisticsHook(); assert started == [1, 1]
        with fused_kernel(False): A.ActivationStats()
        monkeypatch.setenv('MINIAI_FUSED', '0'); A.ActivationStats(); S.StatisticsCollector()
        assert started == [1, 1]

def test_a_collector_with_a_memory_budget_keeps_no_copies():
    "`StatisticsConfig(max_memory_mb=...)` caps the collector's own memory, which copies kept while the loops compile would not count in: its streams keep none (the torch ops record), and the numbers agree to rounding."
    warm()
    from miniai.statistics import StatisticsConfig, StatisticsCollector
    xs = [x.float() for x in batches(3, seed=9)]
    capped, free = StatisticsCollector(StatisticsConfig(max_memory_mb=64)), StatisticsCollector(StatisticsConfig())
    with compiling():
        for x in xs:
            for c in (capped, free): c.update_statistics('m', None, x)
        kept = {name: sum(len(s._kept) for s in c._streams.values()) for name, c in (('capped', capped), ('free', free))}
        assert kept == {'capped': 0, 'free': 3}
    a, b = capped.get_statistics('m').output_stats, free.get_statistics('m').output_stats
    assert (a.count, a.nonfinite, a.min, a.max) == (b.count, b.nonfinite, b.min, b.max)
    assert a.mean == pytest.approx(b.mean, rel=1e-12) and a.std == pytest.approx(b.std, rel=1e-12)


def test_the_cache_marker_follows_the_source_content_not_its_time(tmp_path, monkeypatch):
    "numba stamps its disk cache with a hash of the source: a re-exported kernel.py (same bytes, a new time) keeps its compiled loops, so it counts as cached (a first step then loads them, no compiler starts); changed bytes do not."
    import hashlib, json, os, time
    from pathlib import Path
    with fused_kernel(True): assert K.loops_for(torch.randn(4)) is not None
    assert K._cached()                                  # the loops this process loaded or compiled are marked beside numba's cache
    src = tmp_path/'kernel.py'
    src.write_bytes(Path(K.__file__).read_bytes())
    (tmp_path/'cache').mkdir()
    monkeypatch.setattr(K, '__file__', str(src))
    monkeypatch.setenv('NUMBA_CACHE_DIR', str(tmp_path/'cache'))
    assert not K._cached()                              # nothing compiled for this copy yet
    K._mark_cached()
    assert K._cached() and json.loads(Path(K._marker()).read_text())['sha256'] == hashlib.sha256(src.read_bytes()).hexdigest()
    later = time.time() + 60
    os.utime(src, (later, later))
    assert K._cached()                                  # a newer time, the same bytes
    src.write_bytes(src.read_bytes() + b'\n# changed\n')
    assert not K._cached()
    K._mark_cached()
    assert K._cached()
    Path(K._marker()).write_text('{')
    assert not K._cached()                              # an unreadable marker: not cached, no error


def test_the_compiling_process_builds_the_same_loops_without_torch():
    "The compiling process takes the loops out of kernel.py's source and compiles them without importing torch; numba keys its disk cache by file, module, name, first line and bytecode, so these must be the module's own, or the cache it writes would never be loaded."
    import hashlib, json, subprocess, sys
    call = "written = ns['_jit_loops'](ns)\n"
    assert call in K._CHILD
    report = ("import json, hashlib\n"
              "print(json.dumps(['torch' in sys.modules, {n: [f.__code__.co_filename, f.__module__, f.__qualname__, f.__code__.co_firstlineno, hashlib.sha256(f.__code__.co_code).hexdigest()]"
              " for n, f in ns.items() if n in ns['_LOOP_NAMES'] or n == '_jit_loops'}]))\nwritten = False\n")
    out = subprocess.run([sys.executable, '-c', K._CHILD.replace(call, report), K._record_loop.__code__.co_filename, K.__name__],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    torch_imported, funcs = json.loads(out.stdout)
    assert not torch_imported
    want = {n: [f.__code__.co_filename, f.__module__, f.__qualname__, f.__code__.co_firstlineno, hashlib.sha256(f.__code__.co_code).hexdigest()]
            for n, f in ((n, getattr(K, n)) for n in K._LOOP_NAMES + ('_jit_loops',))}
    assert funcs == want


def test_once_the_torch_ops_have_cost_a_compile_a_recording_waits_for_the_loops(monkeypatch):
    "A cold start on a busy machine: the compiling process runs only when training waits. Once recording with the torch ops has taken `_PAUSE_AFTER` seconds, the next CPU recording waits for the loops (warning once) and records with them; before that, none waits."
    import threading, time, warnings
    warm()
    ready_loops = {k: K._LOOPS[k] for k in ('record', 'rows', 'sketch')}
    xs = batches(4, seed=4)
    with fused_kernel(False):
        ref = Recorder(seed=2)
        for x in xs: ref.record(x)
    monkeypatch.setitem(K._FALLBACK, 'seconds', 0.)
    monkeypatch.setitem(K._FALLBACK, 'warned', False)
    rec = Recorder(seed=2)
    rec.keep_ok = False                                   # no copies: the torch ops record while the loops compile
    try:
        with compiling():
            K._COMPILED.clear()
            with warnings.catch_warnings():
                warnings.simplefilter('error')            # no wait, no warning yet
                rec.record(xs[0]); rec.record(xs[1])
            spent = K._FALLBACK['seconds']
            assert spent > 0 and 'record' not in K._LOOPS
            with fused_kernel(False): rec.record(xs[2])  # the torch ops chosen: not a stand-in for the loops, not counted
            assert K._FALLBACK['seconds'] == spent
            monkeypatch.setattr(K, '_PAUSE_AFTER', spent)  # the torch ops have now cost a compile
            def compiled(): time.sleep(0.3); K._LOOPS.update(ready_loops); K._COMPILED.set()
            threading.Thread(target=compiled).start()
            t0 = time.perf_counter()
            with pytest.warns(UserWarning, match='still compiling'): rec.record(xs[3])
            assert time.perf_counter() - t0 >= 0.25 and 'record' in K._LOOPS    # it waited, then recorded with the loops
    finally: K._COMPILED.set()
    assert len(rec) == 4 and torch.equal(rec.moments.count, ref.moments.count) and torch.equal(rec.moments.nan, ref.moments.nan)
    assert torch.allclose(rec.moments.mean, ref.moments.mean, rtol=1e-12, equal_nan=True)


def test_an_install_without_a_writable_pycache_keeps_its_marker_in_the_users_cache(tmp_path, monkeypatch):
    "An install this user cannot write to (here: its `__pycache__` cannot be a folder): numba caches the loops in the user's folder, and the marker goes to the user's cache folder, so later processes still find the loops cached."
    from pathlib import Path
    pkg = tmp_path/'site'/'miniai'
    pkg.mkdir(parents=True)
    (pkg/'kernel.py').write_bytes(Path(K.__file__).read_bytes())
    (pkg/'__pycache__').write_text('not a folder')
    monkeypatch.setattr(K, '__file__', str(pkg/'kernel.py'))
    monkeypatch.delenv('NUMBA_CACHE_DIR', raising=False)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path/'home-cache'))
    assert not K._cached()
    assert K._marker().startswith(str(tmp_path/'home-cache'/'miniai'))
    K._mark_cached()
    assert K._cached() and len(list((tmp_path/'home-cache'/'miniai').glob('miniai-kernel-*.json'))) == 1
