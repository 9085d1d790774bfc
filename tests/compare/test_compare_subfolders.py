"""`tensors` and `grads` are a dump folder's subfolders: `compare_dumps(subfolders=...)` and `--subfolders` pick them;
`kinds=` and `--kinds`, their earlier names, still work."""
import pytest, torch
from torch import nn
from miniai.dumps import SavingHook
from miniai.compare import compare_dumps, compare_main

def _dump(root):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    with SavingHook(model, root, 'Linear') as h: model(torch.randn(5, 4)).sum().backward()

@pytest.fixture
def runs(tmp_path):
    _dump(tmp_path/'A'); _dump(tmp_path/'B')
    return tmp_path/'A', tmp_path/'B'

def test_subfolders_and_their_earlier_name(runs):
    new = compare_dumps(*runs, subfolders=('grads',), progress=False, verbose=False)
    old = compare_dumps(*runs, kinds=('grads',), progress=False, verbose=False)
    assert list(new) == list(old) == [('grads', 0)] and len(new[('grads', 0)]['compared']) == 2
    with pytest.raises(TypeError, match='`kinds` is another name for `subfolders`'):
        compare_dumps(*runs, subfolders=('tensors',), kinds=('grads',))

@pytest.mark.parametrize('flag', ['--subfolders', '--kinds'])
def test_command_line_flag_and_its_earlier_name(runs, flag, capsys):
    with pytest.raises(SystemExit) as e: compare_main(['--pathA', str(runs[0]), '--pathB', str(runs[1]), '--no-progress', flag, 'tensors'])
    out = capsys.readouterr().out
    assert e.value.code == 0 and 'tensors/rank_0: 1 compared' in out and 'grads/rank_0' not in out, out
