"""Execute notebooks in place with a real Jupyter kernel (nbclient), saving outputs.
Usage (repo root): .venv/bin/python tools/runnb.py nbs/X.ipynb ...  (then nbdev-clean and nbdev-export)"""
import sys, time, os
os.environ.pop('MPLBACKEND', None)   # the kernel inherits it: Agg would drop every inline figure
from pathlib import Path
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

for p in sys.argv[1:]:
    p = Path(p).absolute()
    t = time.time()
    nb = nbformat.read(p, as_version=4)
    stash = {}
    for i, c in enumerate(nb.cells):   # honour nbdev's `#| eval: false`
        if c.cell_type == 'code' and '#| eval: false' in c.source: stash[i] = c.source; c.source = ''
    client = NotebookClient(nb, timeout=1200, kernel_name='python3', resources={'metadata': {'path': str(p.parent)}})
    try: client.execute()
    except CellExecutionError as e:
        for i, src in stash.items(): nb.cells[i].source = src
        print(f'{p.name}: FAILED\n{str(e)[-3000:]}'); nbformat.write(nb, p); sys.exit(1)
    for i, src in stash.items(): nb.cells[i].source = src
    nbformat.write(nb, p)
    print(f'{p.name}: ran in {time.time()-t:.1f}s')
