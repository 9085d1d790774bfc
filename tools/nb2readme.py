"""Write README.md from nbs/index.ipynb without Quarto: markdown cells as they are, code cells and their text outputs fenced.
(`nbdev-readme` does the same through Quarto, for those who have it.) Usage: python tools/nb2readme.py"""
import json, re
from pathlib import Path

root = Path(__file__).parent.parent
nb = json.loads((root/'nbs'/'index.ipynb').read_text())
parts = []
for cell in nb['cells']:
    src = ''.join(cell['source']).strip()
    if cell['cell_type'] == 'markdown': parts.append(re.sub(r'\]\((?!https?:|/|#)', '](nbs/', src)); continue   # links relative to nbs/, as README sits one up
    if not src or src.startswith('#|'): continue
    parts.append(f'```python\n{src}\n```')
    for o in cell.get('outputs', []):
        text = ''.join(o.get('text', '') or o.get('data', {}).get('text/plain', ''))
        if text.strip() and 'Figure size' not in text: parts.append(f'```\n{text.rstrip()}\n```')
(root/'README.md').write_text('<!-- Generated from nbs/index.ipynb by tools/nb2readme.py: edit the notebook, not this file. -->\n\n' + '\n\n'.join(parts) + '\n')
print('README.md written')
