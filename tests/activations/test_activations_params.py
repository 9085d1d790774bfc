"""`ActivationStats(weights=True, param_grads=True, per_channel=...)`: each hooked layer's own parameters and their `.grad`
after backward, and exact per-channel statistics of the outputs (channels_last too), read without touching any tensor;
`diagnose` rows for the parameters (an all-zero or NaN gradient)."""
import copy, math, warnings
import pytest, torch
from torch import nn
import torch.nn.functional as F

from miniai.activations import ActivationStats, format_diagnosis
from miniai.findings import format_finding

from _steps import convnet, sgd_steps as loop

pytestmark = pytest.mark.usefixtures('one_thread')   # see conftest.py


def close(a, b): return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300)


def test_weights_and_param_grads_are_the_tensors_read_at_each_step():
    a = ActivationStats(['0', '2'], weights=True, param_grads=True)
    seen = loop(convnet(), a)
    params, grads = a.params(), a.params(grads=True)
    assert sorted(params) == ['0.bias', '0.weight', '2.bias', '2.weight'] and sorted(grads) == sorted(params)
    w, gr = params['0.weight'], grads['0.weight']
    assert len(w) == len(gr) == 3
    for i in range(3):       # exact: the float64 statistics of the very values (numpy's float64 mean and std as reference)
        wv, gv = seen['w'][i].double(), seen['g'][i].double()
        assert close(w.means[i].item(), wv.mean().item()) and close(w.stds[i].item(), wv.std().item())
        assert close(gr.means[i].item(), gv.mean().item()) and close(gr.stds[i].item(), gv.std().item())
    assert list(a.series()) == ['0', '2']        # the outputs' series are unchanged: parameters come through `params`
    keys = list(a.recorders['train']['0'])
    assert keys[0] == 'output' and {'param[weight]', 'param[bias]', 'param_grad[weight]', 'param_grad[bias]'} <= set(keys)


@pytest.mark.parametrize('loops', [True, False], ids=['compiled loops', 'torch path'])
def test_reading_parameters_changes_nothing(loops):
    "The same steps with and without recording give bit-identical weights, gradients and outputs, on both kernel paths; no hook is left behind."
    from miniai.kernel import use_kernel
    m1, m2 = convnet(), convnet()
    with use_kernel('loops' if loops else 'torch'): s1 = loop(m1, ActivationStats(weights=True, param_grads=True, per_channel=True, output_grads=True, hi='auto'))
    s2 = loop(m2)
    for k in s1: assert all(torch.equal(x, y) for x, y in zip(s1[k], s2[k])), k
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    for p in m1.parameters(): assert not p._post_accumulate_grad_hooks, 'a parameter hook was left behind'


def test_param_grads_only_for_recorded_forwards():
    "With every=2 only the 1st and 3rd of four steps are recorded: their backward's `.grad`, not the others'."
    a = ActivationStats(['0'], every=2, param_grads=True)
    seen = loop(convnet(), a, n=4)
    g = a.params(grads=True)['0.weight']
    assert len(g) == 2 and close(g.stds[1].item(), seen['g'][2].double().std().item())


def test_a_copy_of_the_hooked_model_records_nothing():
    m = convnet()
    a = ActivationStats(['0'], param_grads=True)
    with a.attach(m):
        m2 = copy.deepcopy(m)        # the parameter hooks copy as inert functions
        m2(torch.randn(2, 3, 8, 8)).sum().backward()
        m(torch.randn(2, 3, 8, 8)).sum().backward()
    assert len(a.params(grads=True)['0.weight']) == 1


class Gated(nn.Module):
    "`b`'s output is multiplied by `gate`: 0 gives `b` an all-zero gradient, NaN a NaN one."
    def __init__(self, gate):
        super().__init__(); torch.manual_seed(0)
        self.a, self.b, self.gate = nn.Linear(4, 4), nn.Linear(4, 4), gate
    def forward(self, x): return self.a(x) + self.b(x) * self.gate


def run_gated(gate):
    m, a = Gated(gate), ActivationStats(weights=True, param_grads=True)
    with a.attach(m):
        for _ in range(3): m(torch.randn(5, 4)).pow(2).sum().backward()
    return {r['layer']: r for r in a.diagnose()}


def test_diagnose_rows_for_parameters():
    rows = run_gated(0.)
    assert list(rows) == ['a', 'a.weight', 'a.weight.grad', 'a.bias', 'a.bias.grad', 'b', 'b.weight', 'b.weight.grad', 'b.bias', 'b.bias.grad']
    assert rows['b.weight.grad']['flags'] == ['zero gradient'] and rows['b.bias.grad']['flags'] == ['zero gradient']
    assert rows['a.weight.grad']['flags'] == [] and rows['a.weight']['flags'] == []      # a weight's small std is no finding
    assert math.isnan(rows['a.weight']['dead']) and rows['a.weight']['output'] == 'param[weight]'
    f = rows['b.weight.grad']['findings'][0]
    assert format_finding(f) == 'b.weight.grad gets no gradient: all 16 values of its gradient were exactly 0 in the batches read'
    assert 'b.weight.grad' in format_diagnosis(list(rows.values()))
    nan = run_gated(math.nan)
    assert nan['b.weight.grad']['flags'] == ['no finite values'] and nan['a.weight.grad']['flags'] == ['no finite values']
    txt = format_diagnosis(list(nan.values())).splitlines()[-1]
    assert txt.startswith('first NaN/Inf: layer ') and 'batch 0' in txt


def test_per_channel_exact_and_channels_last_the_same():
    a, b = ActivationStats(['0', '2'], per_channel=True), ActivationStats(['0', '2'], per_channel=True)
    seen = loop(convnet(), a)
    loop(convnet(), b, channels_last=True)
    cs = a.channels['train']['0']['output']
    assert len(cs) == 3 and cs.means.shape == (3, 4) and cs.stds.dtype == torch.float64
    for i, out in enumerate(seen['out']):
        o = out.double()
        for c in range(4):
            assert close(cs.means[i, c].item(), o[:, c].mean().item()) and close(cs.stds[i, c].item(), o[:, c].std().item())
    for layer in ('0', '2'):
        x, y = a.channels['train'][layer]['output'].moments.t, b.channels['train'][layer]['output'].moments.t
        assert torch.equal(x.nan_to_num(), y.nan_to_num())     # channels_last: the same values in the same order, the same numbers


def test_per_channel_on_the_last_dim_and_skips():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(6, 3), nn.Flatten(0))        # [B, T, 3] then a 1-d output
    a = ActivationStats(['0', '1'], per_channel=-1)
    xs = [torch.randn(2, 5, 6) for _ in range(2)]
    outs = [m[0](x).detach() for x in xs]
    with a.attach(m):
        for x in xs: m(x)
    cs = a.channels['train']['0']['output']
    assert cs.means.shape == (2, 3)
    assert close(cs.means[0, 2].item(), outs[0][..., 2].double().mean().item())
    assert '1' not in a.channels['train'] or not a.channels['train']['1']
    assert 'no channel dim' in a.skipped['1']['output.channels']


def test_bad_arguments_named():
    with pytest.raises(TypeError, match='`per_channel`'): ActivationStats(per_channel='channels')
    a = ActivationStats(weights=True)
    with pytest.raises(ValueError, match='`phase`'): a.params('test')


@pytest.mark.parametrize('reentrant', [True, False])
def test_param_grads_under_checkpointing(reentrant):
    "A checkpointed layer's `.grad` is recorded once per step in both modes (its forward runs without grad with `use_reentrant=True`)."
    from torch.utils.checkpoint import checkpoint
    class Ck(nn.Module):
        def __init__(self):
            super().__init__(); torch.manual_seed(0); self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)
        def forward(self, x): return self.b(checkpoint(self.a, x, use_reentrant=reentrant))
    m, a = Ck(), ActivationStats(param_grads=True)
    grads = []
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        with a.attach(m):
            for _ in range(3):
                m(torch.randn(5, 4, requires_grad=True)).pow(2).sum().backward()
                grads.append(m.a.weight.grad.clone()); m.zero_grad()
    g = a.params(grads=True)
    assert len(g['a.weight']) == len(g['b.weight']) == 3
    assert all(close(g['a.weight'].stds[i].item(), grads[i].double().std().item()) for i in range(3))


def test_streams_are_named_by_the_grammar_every_recorder_shares():
    "`streams()` names each recorder as the collector names its streams: 'layer.kind', '[key]' for a further output or a parameter."
    from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    a = ActivationStats(layers=['0'], output_grads=True, weights=True, param_grads=True)
    c = ActivationStatisticsHook(StatisticsConfig(collect_weights=True, collect_param_grads=True, collect_input=False))
    with a.attach(m), c.attach(m, layers=['0']): m(torch.randn(2, 3)).sum().backward()
    assert sorted(a.streams()) == ['0.output', '0.output_grad', '0.param[bias]', '0.param[weight]', '0.param_grad[bias]', '0.param_grad[weight]']
    assert a.streams()['0.param_grad[weight]'] is a.recorders['train']['0']['param_grad[weight]']
    from miniai.param_book import stream_name
    st = c.get_statistics('0')
    names = {stream_name('0', 'output')} | {stream_name('0', kind, pn) for kind in ('param', 'param_grad') for pn in getattr(st, kind + 's')}
    assert names == set(a.streams()) - {'0.output_grad'}               # the collector records no output gradients
