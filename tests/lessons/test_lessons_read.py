"""The lessons read as the course's: every cell that draws is committed with its picture, and the visible cells hold
only the few checks that teach (edge cases live in `#|hide` cells and tests/); the story lessons show code in short
cells; every picture is one a reader can see; README's table names every notebook, each under a number of its own."""
import ast, base64, json, re, struct
from pathlib import Path
import pytest

nbs_path = Path(__file__).parents[2]/'nbs'
notebooks = sorted(p for p in nbs_path.glob('*.ipynb') if not p.name.startswith('_'))

# functions and methods that draw a figure: miniai's plots and the matplotlib calls a lesson makes itself
DRAWS = {'color_dim', 'dead_chart', 'plot_stats', 'show_image', 'show_images', 'show_image_batch', 'plot_func',
         'plot_percentile_bands', 'lr_find', 'imshow', 'plot', 'hist', 'bar', 'barh', 'scatter', 'fill_between',
         'matshow', 'pcolormesh', 'semilogy', 'loglog'}
TEST_LINE = re.compile(r'^\s*(assert\b|test_\w*\(|test_\w+\s*\(|[\w.]*\btest_(eq|ne|close|fail|warns|is|shuffled|stdout|eq_type)\b)')
MAX_VISIBLE_TEST_LINES = 20
STORY_LESSONS = ('10_activations', '11_initializing')   # the course's lessons told as stories: short visible cells
SHORT_CELLS = STORY_LESSONS + ('09h_activation_stats',)    # and the reference lesson built in small cells
MAX_VISIBLE_CELL_LINES = 40
MIN_PICTURE_PX = 100                  # a picture narrower or lower than this shows nothing (a stripe from a test's figure)

def _source(cell): return ''.join(cell['source']) if isinstance(cell['source'], list) else cell['source']
def _directives(src): return {m.replace(' ', '') for m in re.findall(r'^\s*#\s*\|\s*([\w-]+(?::\s*\w+)?)', src, re.M)}

def _draw_calls(src):
    "Names of the drawing calls made by the cell itself (not inside a function or class it defines)."
    try: tree = ast.parse('\n'.join(l for l in src.splitlines() if not l.lstrip().startswith(('%', '!'))))
    except SyntaxError: return []
    found = []
    def walk(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)): return
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in DRAWS: found.append(name)
        for child in ast.iter_child_nodes(node): walk(child)
    walk(tree)
    return found

def _cells(nb_path):
    nb = json.loads(nb_path.read_text())
    return [c for c in nb['cells'] if c['cell_type'] == 'code']

@pytest.mark.parametrize('nb_path', notebooks, ids=[p.stem for p in notebooks])
def test_drawing_cells_have_their_picture(nb_path):
    "Every visible cell that calls a drawing function was committed with an image output (a hidden check closes its figures)."
    missing = []
    for i, cell in enumerate(_cells(nb_path)):
        src = _source(cell)
        d = _directives(src)
        if d & {'export', 'exports', 'eval:false', 'notest', 'hide'}: continue   # definitions, cells that never run, and hidden checks (a reader sees no picture of theirs)
        calls = _draw_calls(src)
        if not calls: continue
        if not any('image/png' in o.get('data', {}) for o in cell.get('outputs', [])):
            missing.append(f"code cell {i} calls {', '.join(sorted(set(calls)))}: {src.splitlines()[0][:80]!r}")
    assert not missing, (f"{nb_path.name}: {len(missing)} drawing cell(s) committed without their picture (execute with "
                         "inline figures: .venv/bin/python tools/runnb.py, not MPLBACKEND=Agg):\n" + '\n'.join(missing))

@pytest.mark.parametrize('nb_path', notebooks, ids=[p.stem for p in notebooks])
def test_visible_cells_hold_few_test_lines(nb_path):
    "At most a few test lines in the cells a reader sees: the ones that teach."
    n = 0
    for cell in _cells(nb_path):
        src = _source(cell)
        if _directives(src) & {'hide', 'exporti'}: continue
        if _directives(src) & {'export', 'exports'}: continue
        n += sum(1 for l in src.splitlines() if TEST_LINE.match(l))
    assert n <= MAX_VISIBLE_TEST_LINES, (f"{nb_path.name}: {n} visible test lines (at most {MAX_VISIBLE_TEST_LINES}): move edge cases "
                                          "and regressions to `#|hide` cells or tests/")

def test_the_checks_see_what_they_look_for():
    "The two checks find drawing calls and test lines where a reader would, and not inside definitions."
    assert _draw_calls("astats.color_dim()\nfor x in xs: show_image(x)") == ['color_dim', 'show_image']
    assert _draw_calls("def f(ax): ax.plot([1])\nclass A:\n    def g(self): plt.imshow(1)") == []
    assert _draw_calls("fig, axs = plt.subplots(1, 2)\nfor a, ax in zip(stats, axs): a.color_dim(ax=ax)") == ['color_dim']
    assert _directives("#| hide\nx") == {'hide'} and _directives("#|eval: false\n") == {'eval:false'}
    assert [bool(TEST_LINE.match(l)) for l in ("test_eq(a, b)", "  assert x", "x = test_result", "fc.test_close(a, b)")] == [True, True, False, True]

@pytest.mark.parametrize('name', SHORT_CELLS)
def test_story_lessons_show_short_cells(name):
    "A story lesson's (or the reference lesson's) visible code cells, exported ones included, are at most 40 lines: longer code goes to a hidden cell or its own notebook."
    long = []
    for i, cell in enumerate(_cells(nbs_path/f'{name}.ipynb')):
        src = _source(cell)
        if 'hide' in _directives(src): continue
        if (n := len(src.splitlines())) > MAX_VISIBLE_CELL_LINES: long.append(f"code cell {i}: {n} lines: {src.splitlines()[0][:60]!r}")
    assert not long, f"{name}: visible cells longer than {MAX_VISIBLE_CELL_LINES} lines:\n" + '\n'.join(long)

def _png_size(b64):
    "Width and height of a base64 PNG, from its IHDR chunk."
    return struct.unpack('>II', base64.b64decode(b64)[16:24])

@pytest.mark.parametrize('nb_path', notebooks, ids=[p.stem for p in notebooks])
def test_pictures_can_be_seen(nb_path):
    "Every committed picture is at least 100 pixels each way: a figure a hidden test drew by the way is closed, not committed."
    small = [f"code cell {i}: {w}x{h} px" for i, cell in enumerate(_cells(nb_path)) for o in cell.get('outputs', [])
             if 'image/png' in o.get('data', {}) for w, h in [_png_size(o['data']['image/png'])] if min(w, h) < MIN_PICTURE_PX]
    assert not small, f"{nb_path.name}: pictures too small to show anything:\n" + '\n'.join(small)

def test_readme_lists_every_notebook_under_its_own_number():
    "index.ipynb (README.md) has a row for every notebook, and no two notebooks share a number (`10a`)."
    index = ''.join(_source(c) for c in json.loads((nbs_path/'index.ipynb').read_text())['cells'] if c['cell_type'] == 'markdown')
    stems = [p.stem for p in notebooks if p.stem != 'index']
    assert not (missing := [s for s in stems if f'`{s}`' not in index]), f"notebooks missing from index.ipynb's table: {missing}"
    numbers = [s.split('_')[0] for s in stems]
    assert not (twice := sorted({n for n in numbers if numbers.count(n) > 1})), f"numbers shared by two notebooks: {twice}"

def test_png_size_reads_the_header():
    import io, matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(1, 2), dpi=50); buf = io.BytesIO(); fig.savefig(buf, format='png'); plt.close(fig)
    assert _png_size(base64.b64encode(buf.getvalue())) == (50, 100)
