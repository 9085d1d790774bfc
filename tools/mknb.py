"""Build an .ipynb from a plain-text source.

Cells are separated by marker lines:
  #%% md      -> a markdown cell (the following lines are raw markdown)
  #%%         -> a code cell
Usage: python mknb.py SRC.py DEST.ipynb
"""
import sys, json, re, hashlib

def parse(text):
    cells, kind, buf = [], None, []
    def flush():
        if kind is None: return
        src = '\n'.join(buf).strip('\n')
        if src or kind == 'code':
            if src: cells.append((kind, src))
    for line in text.splitlines():
        m = re.match(r'^#%%\s*(md)?\s*$', line)
        if m:
            flush(); kind = 'markdown' if m.group(1) else 'code'; buf = []
        else: buf.append(line)
    flush()
    return cells

def to_nb(cells):
    out = []
    for i, (kind, src) in enumerate(cells):
        lines = src.split('\n')
        source = [l + '\n' for l in lines[:-1]] + [lines[-1]]
        cid = hashlib.sha1(f'{i}:{src}'.encode()).hexdigest()[:8]   # stable ids: modules cite them
        c = {'cell_type': kind, 'id': cid, 'metadata': {}, 'source': source}
        if kind == 'code': c.update(execution_count=None, outputs=[])
        out.append(c)
    return {'cells': out, 'metadata': {'kernelspec': {'display_name': 'python3', 'language': 'python', 'name': 'python3'}},
            'nbformat': 4, 'nbformat_minor': 5}

if __name__ == '__main__':
    src, dest = sys.argv[1], sys.argv[2]
    nb = to_nb(parse(open(src).read()))
    with open(dest, 'w') as f: json.dump(nb, f, indent=1, ensure_ascii=False); f.write('\n')
    print(f'{dest}: {len(nb["cells"])} cells')
