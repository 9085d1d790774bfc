"""Print the outputs of an executed notebook (text, truncated) to read them without Jupyter. Usage: python tools/outs.py NB.ipynb"""
import json,sys
nb=json.load(open(sys.argv[1]))
for i,c in enumerate(nb['cells']):
    if c['cell_type']=='code':
        for o in c.get('outputs',[]):
            if 'text' in o: print(i, ''.join(o['text'])[:600])
            elif 'data' in o: print(i, list(o['data'].keys()), str(''.join(o['data'].get('text/plain','')))[:300])
