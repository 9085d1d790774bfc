"""Every notebook in nbs/ is a test: it runs top to bottom, and a failing cell fails the test, named."""
import re
from pathlib import Path
import pytest
from execnb.shell import CaptureShell
from fastcore.nbio import read_nb

nbs_path = Path(__file__).parents[2]/'nbs'
notebooks = sorted(p for p in nbs_path.glob('*.ipynb') if not p.name.startswith('_'))

_EXPORT_CALL = re.compile(r'(import nbdev;\s*)?nbdev\.nbdev_export\(\)')

def _is_skipped(cell):
    "Markdown, `#|notest` and `#|eval: false` cells, and the author's `nbdev_export()` cells: `make test` exports once before the tests, and a notebook rewriting the modules mid-run could be read half-written by another worker's import."
    if cell.cell_type != 'code' or re.search(r'^\s*#\s*\|\s*(notest|eval:\s*false)', cell.source, re.M): return True
    code = [l.strip() for l in cell.source.splitlines() if l.strip() and not l.lstrip().startswith('#')]
    return bool(code) and all(_EXPORT_CALL.fullmatch(l) for l in code)

@pytest.mark.parametrize('nb_path', notebooks, ids=[p.stem for p in notebooks])
def test_notebook(nb_path, monkeypatch):
    monkeypatch.chdir(nb_path.parent)
    nb = read_nb(nb_path)
    shell = CaptureShell(mpl_format='png')
    shell.set_path(str(nb_path.parent))
    for i, cell in enumerate(nb.cells):
        if _is_skipped(cell): continue
        shell.cell(cell)
        if shell.exc:
            src = '\n'.join(cell.source.splitlines()[:12])
            pytest.fail(f"{nb_path.name}: cell {i} failed with {type(shell.exc).__name__}: {shell.exc}\n--- cell {i} ---\n{src}\n---\n"
                        + shell.prettytb(fname=nb_path), pytrace=False)
