"""The house's structural rules, read from the package itself: a lean public surface (the `__all__` lists, each name counted
once), one home per name (re-exported only where the course's own module re-exports it), and no module importing
another module's `_private` name."""
import ast, importlib, pkgutil, pathlib
import miniai

PKG = pathlib.Path(miniai.__file__).parent
# the course's re-exports: `from miniai.X import *` finds these names although their home is elsewhere
COURSE_REEXPORTS = {'activations': {'Hook', 'Hooks', 'HooksCallback'}, 'init': {'conv'}, 'conv': {'def_device', 'to_device'},
                    'learner': {'def_device', 'to_device', 'to_cpu'}}

def _modules():
    for m in pkgutil.iter_modules(miniai.__path__):
        if not m.name.startswith('_'): yield m.name, importlib.import_module(f'miniai.{m.name}')

def test_at_most_120_public_names():
    names = set()
    for _, mod in _modules(): names |= set(getattr(mod, '__all__', []))
    assert len(names) <= 120, f"{len(names)} public names (the __all__ lists): {sorted(names)}"

def test_one_home_per_name():
    homes = {}
    for name, mod in _modules():
        for n in getattr(mod, '__all__', []):
            obj = getattr(mod, n)
            home = getattr(obj, '__module__', None)
            if home == mod.__name__ or n in COURSE_REEXPORTS.get(name, ()): continue
            if home and home.startswith('miniai.'): homes.setdefault(n, []).append(name)
    assert not homes, f"re-exported outside the course's re-exports: {homes}"

def test_no_module_imports_another_modules_private_names():
    bad = []
    for f in sorted(PKG.glob('*.py')):
        if f.name.startswith('_'): continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 1 and (node.module or '') != f.stem:
                bad += [f"{f.name}: from .{node.module} import {a.name}" for a in node.names
                        if a.name.startswith('_') and not a.name.startswith('__')]
    assert not bad, '\n'.join(bad)
