"""`miniai-diagnose` where rank 1 raises after its first training batch: run under torchrun by tests/multiprocess/test_cli.py."""
import os, sys
from miniai import cli
from miniai.learner import Callback

class Boom(Callback):
    def after_batch(self, learn): raise RuntimeError('rank 1 fails on purpose')

if os.environ.get('RANK') == '1':
    build = cli.build_variant
    def build_failing(name, dls, seed=1):
        v = build(name, dls, seed=seed)
        return {**v, 'cbs': list(v.get('cbs', [])) + [Boom()]}
    cli.build_variant = build_failing

sys.exit(cli.main(sys.argv[1:]))
