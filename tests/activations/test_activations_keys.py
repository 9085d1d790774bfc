"""`ActivationStats` keys each layer's recorders by the stream grammar (lesson 09g1): 'output', 'output[1]', 'output_grad',
'param[weight]', 'param_grad[weight]', the stream's name without its layer. The keys it used before ('0', '1', 'grad.0',
'param.weight', 'grad.param.weight') still read the same recorder, with a DeprecationWarning naming the key now, and a folder
saved with them (version 1) loads under the keys now, with the same numbers."""
import json, re, shutil, warnings
import pytest, torch
from torch import nn
from miniai.activations import ActivationStats, format_diagnosis
from miniai.runs import save_stats, load_stats, compare_stats
from miniai.param_book import stream_key, kind_of_key

OLD = {'output': '0', 'output[1]': '1', 'output[2]': '2', 'output_grad': 'grad.0', 'output_grad[1]': 'grad.1',
       'param[weight]': 'param.weight', 'param[bias]': 'param.bias', 'param_grad[weight]': 'grad.param.weight', 'param_grad[bias]': 'grad.param.bias'}

class Pair(nn.Module):
    "Two float outputs and an integer one (skipped, with why)."
    def forward(self, x): return x.relu(), x * 2, x.long()

class Total(nn.Module):
    "One value per sample: no channel dim beside the batch's (its per-channel statistics skipped, with why)."
    def forward(self, x): return x.sum(1)

def _run():
    "Two recorded training steps of a linear layer, a layer of three outputs and one without channels: every kind of stream."
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), Pair())
    total = Total()
    a = ActivationStats(layers=['0', '1'], output_grads=True, weights=True, param_grads=True, per_channel=True, bins=4)
    b = ActivationStats(layers=[total], per_channel=True, bins=4)
    with a.attach(model), b.attach(total):
        for i in range(2):
            x = torch.randn(2, 3, generator=torch.Generator().manual_seed(i))
            o = model(x); (o[0].sum() + o[1].sum()).backward(); total(o[0])
    return a, b

def test_the_keys_are_the_stream_names_without_the_layer():
    a, b = _run()
    recs = a.recorders['train']
    assert list(recs['0']) == ['output', 'output_grad', 'param[weight]', 'param[bias]', 'param_grad[bias]', 'param_grad[weight]']
    assert list(recs['1']) == ['output', 'output_grad', 'output[1]', 'output_grad[1]']
    assert all(stream_key(*kind_of_key(k)) == k for rs in recs.values() for k in rs)
    assert a.streams() == {f'{n}.{k}': r for n, rs in recs.items() for k, r in rs.items()}
    assert a.skipped == {'0': {}, '1': {'output[2]': 'dtype torch.int64 is not floating point'}}
    assert {n: list(c) for n, c in a.channels['train'].items()} == {'0': ['output'], '1': ['output', 'output[1]']}
    assert list(b.skipped.values()) == [{'output.channels': 'shape (2,) has no channel dim 1 beside others'}]
    assert [r['output'] for r in a.diagnose()] == ['output', 'param[weight]', 'param_grad[weight]', 'param[bias]', 'param_grad[bias]', 'output', 'output[1]']
    assert a.hooks[1].recorders is recs['1'] and a.params(grads=True) == {'0.bias': recs['0']['param_grad[bias]'], '0.weight': recs['0']['param_grad[weight]']}

def test_a_key_of_before_reads_the_same_recorder_and_warns():
    a, _ = _run()
    for layers in (a.recorders['train'], a.channels['train'], load_stats(save_stats(a, _tmp())).recorders['train']):
        for name, recs in layers.items():
            for now in list(recs):
                with pytest.warns(DeprecationWarning, match=re.escape(f"keyed by stream now: '{now}', not '{OLD[now]}'")):
                    assert recs[OLD[now]] is recs[now]
                with pytest.warns(DeprecationWarning): assert recs.get(OLD[now]) is recs[now]
                assert kind_of_key(OLD[now]) == kind_of_key(now)
    recs = a.recorders['train']['1']
    with warnings.catch_warnings():
        warnings.simplefilter('error')                # a key neither now nor before: no recorder, and no warning
        with pytest.raises(KeyError): recs['3']
        assert recs.get('grad.2') is None and recs.get('output[3]', 'none') == 'none'

def _tmp():
    import tempfile, pathlib
    return pathlib.Path(tempfile.mkdtemp())/'r'

def _as_version_1(folder):
    "Rewrite the meta.json of `folder` as a folder of version 1 holds it: the recorders' keys of before (the arrays unchanged)."
    meta = json.loads((folder/'meta.json').read_text())
    meta['version'] = 1
    for e in meta['recorders'] + meta['channels']: e['key'] = OLD[e['key']]
    def skip(k): return 'grad.param' if k == 'param_grad' else 'channels.' + OLD[k[:-9]] if k.endswith('.channels') else OLD[k]
    meta['skipped'] = {n: {skip(k): w for k, w in s.items()} for n, s in meta['skipped'].items()}
    (folder/'meta.json').write_text(json.dumps(meta, indent=1))
    return meta

def _bits(t): return t.view(torch.int64) if t.dtype == torch.float64 else t

@pytest.mark.parametrize('which', [0, 1])
def test_a_folder_of_version_1_loads_under_the_keys_now(tmp_path, which):
    run = _run()[which]
    new = save_stats(run, tmp_path/'new')
    old = tmp_path/'old'; shutil.copytree(new, old)
    meta = _as_version_1(old)
    assert which or meta['recorders'][0]['key'] == '0' and {e['key'] for e in meta['recorders']} >= {'grad.0', 'grad.1', 'param.weight', 'grad.param.weight'}
    a, b = load_stats(new), load_stats(old)
    assert {p: {n: list(r) for n, r in l.items()} for p, l in a.recorders.items()} == \
           {p: {n: list(r) for n, r in l.items()} for p, l in b.recorders.items()} == \
           {p: {n: list(r) for n, r in l.items()} for p, l in run.recorders.items()}
    for phase, layers in a.recorders.items():
        for name, recs in layers.items():
            for key, ra in recs.items():
                sa, sb = ra.state_dict(), b.recorders[phase][name][key].state_dict()
                assert torch.equal(_bits(sa['rows']), _bits(sb['rows'])) and torch.equal(sa['raw'], sb['raw']), (phase, name, key)
    assert b.skipped == a.skipped == run.skipped
    assert {n: {k: _bits(c.moments.t) for k, c in cs.items()} for n, cs in b.channels['train'].items()}.keys() == run.channels['train'].keys()
    for name, cs in run.channels['train'].items():
        assert list(b.channels['train'][name]) == list(cs)
        for key, c in cs.items(): assert torch.equal(_bits(b.channels['train'][name][key].moments.t), _bits(c.moments.t))
    assert format_diagnosis(b.diagnose()) == format_diagnosis(run.diagnose()) and repr(b.diagnose()) == repr(run.diagnose())
    assert all(r['flags'] == ['same'] for r in compare_stats(run, old))
    assert json.loads((save_stats(b, tmp_path/'again')/'meta.json').read_text())['version'] == 2   # saved again: the keys now
