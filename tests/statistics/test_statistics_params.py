"""`StatisticsConfig(collect_weights=True, collect_param_grads=True, per_channel=...)`: the run-wide collector's statistics of each
hooked module's own parameters and their `.grad`, and its exact per-channel statistics, against direct torch computations;
`every`, gradient checkpointing, save/load/merge, the quantization export, memory, bad values and cleanup."""
import copy, io, json, math, os, warnings
from unittest import mock
import pytest, torch
from torch import nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from miniai.statistics import StatisticsConfig, StatisticsCollector, ActivationStatisticsHook
from miniai.testing import count_syncs

from _steps import convnet, sgd_steps as loop

pytestmark = pytest.mark.usefixtures('one_thread')   # see conftest.py


def close(a, b): return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300)


def ref_channels(t, dim=1):
    "The per-channel statistics of `t` computed directly, in float64."
    a = t.double().movedim(dim, 0).reshape(t.shape[dim], -1)
    res = dict(count=[], nonfinite=[], mean=[], std=[], min=[], max=[])
    for row in a:
        f = row[torch.isfinite(row)]
        res['count'].append(len(f)); res['nonfinite'].append(len(row) - len(f))
        res['mean'].append(f.mean().item() if len(f) else math.nan)
        res['std'].append(f.std().item() if len(f) > 1 else math.nan)
        res['min'].append(f.min().item() if len(f) else math.nan); res['max'].append(f.max().item() if len(f) else math.nan)
    return res


def same(a, b): return all((x != x and y != y) or close(x, y) for x, y in zip(a, b)) and len(a) == len(b)


def structured(n=4, seed=0):
    "Batches `[8, 4, 5, 5]` whose channels have very different scales (1e-3, 1, 1e4) and one all zero; a NaN in channel 1 of the second batch."
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([1e-3, 1., 1e4, 0.]).view(1, 4, 1, 1)
    xs = [torch.randn(8, 4, 5, 5, generator=g) * scale + scale for _ in range(n)]
    xs[1][3, 1, 2, 2] = math.nan
    return xs


def test_per_channel_exact_against_torch():
    "Per-channel count, nonfinite, mean, std, min, max over four batches equal the direct float64 computation on all of them; channels_last gives the very same numbers; dim=-1 and the input stream too."
    xs = structured()
    ref = ref_channels(torch.cat(xs))
    got = {}
    for fmt in (torch.contiguous_format, torch.channels_last):
        c = StatisticsCollector(StatisticsConfig(per_channel=True, collect_percentiles=[]))
        for x in xs: c.update_statistics('bn', x.contiguous(memory_format=fmt), x.contiguous(memory_format=fmt))
        got[fmt] = c.get_statistics('bn').channels
    ch = got[torch.contiguous_format]['output']
    assert got[torch.channels_last] == got[torch.contiguous_format] and ch == got[torch.contiguous_format]['input']
    assert ch['dim'] == 1 and ch['count'] == ref['count'] == [800, 799, 800, 800] and ch['nonfinite'] == [0, 1, 0, 0]
    assert ch['min'] == ref['min'] and ch['max'] == ref['max']               # exact
    assert same(ch['mean'], ref['mean']) and same(ch['std'], ref['std']) and ch['std'][3] == 0.
    c = StatisticsCollector(StatisticsConfig(per_channel=-1, collect_input=False))
    for x in xs: c.update_statistics('bn', None, x)
    last = c.get_statistics('bn').channels['output']
    r = ref_channels(torch.cat(xs), -1)
    assert last['dim'] == 3 and last['count'] == r['count'] and last['min'] == r['min'] and same(last['std'], r['std'])


def test_per_channel_json_quant_and_odd_shapes():
    "Strict JSON with reasons by channel; per-channel qparams equal torch.ao's PerChannelMinMaxObserver; a tensor without the dim is skipped with why; a change of channel count drops them with why."
    from torch.ao.quantization import PerChannelMinMaxObserver
    xs = structured()
    xs[1][3, 1, 2, 2] = 0.5                            # torch.ao's observer would read the NaN as the channel's range
    c = StatisticsCollector(StatisticsConfig(per_channel=True))
    for x in xs: c.update_statistics('m', None, x[:, :3])
    c.update_statistics('one', None, torch.ones(1, 3))    # one value per channel: std has no value
    c.update_statistics('flat', None, torch.randn(5))
    e = json.loads(json.dumps(c.export_statistics(), allow_nan=False))
    assert e['one']['channels']['output']['std'] == [None] * 3 and e['one']['channels']['output']['std_reason'] == {str(i): 'needs at least 2 finite values' for i in range(3)}
    assert 'channels' not in e['flat'] and 'flat.output.channels' in c.skipped
    q = c.export_statistics('quantization')['m']['per_channel']
    for qs in ('affine', 'symmetric'):
        for dt in ('quint8', 'qint8'):
            obs = PerChannelMinMaxObserver(ch_axis=1, dtype=getattr(torch, dt), qscheme=getattr(torch, f'per_channel_{qs}'))
            for x in xs: obs(x[:, :3])
            s, z = obs.calculate_qparams()
            assert q['qparams'][qs][dt]['scale'] == s.tolist() and q['qparams'][qs][dt]['zero_point'] == z.tolist(), (qs, dt)
    c.update_statistics('m', None, xs[0])               # 4 channels now: its per-channel statistics are dropped, with why
    assert c.get_statistics('m').channels == {} and c.get_statistics('m').output_stats.count == 4 * 8 * 3 * 25 + 8 * 4 * 25
    assert 'dropped' in c.skipped['m.output.channels']
    c = StatisticsCollector(StatisticsConfig(per_channel=True))
    c.update_statistics('inf', None, torch.full((2, 3), math.inf))
    e = c.export_statistics()['inf']['channels']['output']
    assert e['min'] == [None] * 3 and e['min_reason']['0'] == 'no finite values' and e['nonfinite'] == [2] * 3


@pytest.mark.parametrize('loops', [True, False], ids=['compiled loops', 'torch path'])
def test_weights_and_grads_exact_and_nothing_touched(loops):
    "Weights as each forward saw them and `.grad` after each backward: the run-wide statistics of all of them, exactly; no host sync; outputs, weights and grads bit-identical to an unhooked run, on both kernel paths; no hook left; the hooked model copies and saves."
    with mock.patch.dict(os.environ, MINIAI_KERNEL='loops' if loops else 'torch'):
        c = ActivationStatisticsHook(StatisticsConfig(collect_weights=True, collect_param_grads=True, per_channel=True, exact=True))
        m1, m2 = convnet(), convnet()
        with c.attach(m1):
            copy.deepcopy(m1); torch.save(m1, io.BytesIO())
        with count_syncs() as cs: s1 = loop(m1, c, layers=lambda m: not any(m.children()))   # the ReLU too: a module without parameters
        s2 = loop(m2)
    assert cs.n == 0, cs.ops               # recording weights, grads and channels reads nothing back to the host
    for k in s1: assert all(torch.equal(x, y) for x, y in zip(s1[k], s2[k])), k
    assert all(torch.equal(p, q) for p, q in zip(m1.parameters(), m2.parameters()))
    assert not any(p._post_accumulate_grad_hooks for p in m1.parameters()) and not any(m._forward_hooks for m in m1.modules())
    st = c.get_statistics('0')
    assert sorted(st.params) == sorted(st.param_grads) == ['bias', 'weight'] and c.get_statistics('1').params == {}
    for got, vals in ((st.params['weight'], s1['w']), (st.param_grads['weight'], s1['g'])):
        ref = torch.cat([v.double().flatten() for v in vals])
        assert got.count == ref.numel() and got.min == ref.min().item() and got.max == ref.max().item()
        assert close(got.mean, ref.mean().item()) and close(got.std, ref.std().item())
    ch = st.channels['output']
    assert ch['count'] == [3 * 8 * 64] * 4 and same(ch['mean'], ref_channels(torch.cat(s1['out']))['mean'])
    wch = st.channels['param[weight]']       # per output channel (dim 0), as torch.ao's weight observers; none for the 1-d bias
    assert wch['dim'] == 0 and wch['count'] == [3 * 27] * 4 and 'param[bias]' not in st.channels
    from torch.ao.quantization import PerChannelMinMaxObserver
    obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    for w in s1['w']: obs(w)
    scale, zp = obs.calculate_qparams()
    q = c.export_statistics('quantization')['0']['params_per_channel']['weight']['qparams']['symmetric']['qint8']
    assert q == dict(scale=scale.tolist(), zero_point=zp.tolist())
    e = json.loads(json.dumps(c.export_statistics(), allow_nan=False))
    assert e['1']['params'] == {} and 'no parameters of its own' in e['1']['params_reason']
    assert e['0']['param_grads']['weight']['count'] == got.count


def test_every_and_checkpointing():
    "With every=2, steps 1 and 3 of four: their weights and grads only. Checkpointed layers (both `use_reentrant` modes): each step counted once, numbers equal to the unchecked model's."
    c = ActivationStatisticsHook(StatisticsConfig(every=2, collect_weights=True, collect_param_grads=True))
    seen = loop(convnet(), c, n=4, layers=['0'])
    st = c.get_statistics('0')
    ref = torch.cat([seen['g'][0].flatten(), seen['g'][2].flatten()]).double()
    assert st.n_updates == 2 and st.params['weight'].count == st.param_grads['weight'].count == ref.numel()
    assert close(st.param_grads['weight'].std, ref.std().item())

    class Ck(nn.Module):
        def __init__(self, mode):
            super().__init__(); torch.manual_seed(0); self.mode = mode
            self.a, self.b, self.c = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 2)
        def forward(self, x):
            x = self.a(x)
            return self.c(self.b(x) if self.mode is None else checkpoint(self.b, x, use_reentrant=self.mode))
    res = {}
    for mode in (None, True, False):
        m, g = Ck(mode), torch.Generator().manual_seed(2)
        c = ActivationStatisticsHook(StatisticsConfig(collect_param_grads=True, collect_weights=True, per_channel=True, collect_percentiles=[]))
        with warnings.catch_warnings(), c.attach(m):
            warnings.simplefilter('ignore')
            for _ in range(3):
                m(torch.randn(5, 4, generator=g)).pow(2).sum().backward()
                m.zero_grad()
        res[mode] = c.get_statistics('b')
        assert not any(p._post_accumulate_grad_hooks for p in m.parameters())
    for mode in (True, False):
        a, b = res[mode], res[None]
        assert a.n_updates == 3 and a.param_grads['weight'].count == a.params['weight'].count == 3 * 36, mode
        for part in ('params', 'param_grads'):
            x, y = getattr(a, part)['weight'], getattr(b, part)['weight']
            assert x.count == y.count and close(x.std, y.std) and x.min == y.min, (mode, part)
        assert a.channels == b.channels


def test_save_load_merge_and_memory(tmp_path):
    "save/load and state_dict round-trip the new streams bit for bit; two halves merge into the whole; the streams count in memory_bytes and a tight max_memory_mb skips them, with why."
    xs = structured(6)
    cfg = StatisticsConfig(per_channel=True, collect_weights=True, collect_param_grads=True)
    lin = nn.Linear(5, 3)
    whole, first, second = (StatisticsCollector(cfg) for _ in range(3))
    for i, x in enumerate(xs):
        for c in (whole, first if i < 3 else second): c.update_statistics('m', x, x, training=False, module=lin)
    path = tmp_path / 'c.json'
    first.save(path)
    back = StatisticsCollector.load(path)
    assert back.state_dict() == first.state_dict() and back.get_statistics('m') == first.get_statistics('m')
    assert back.memory_bytes == first.memory_bytes
    merged = back.merge(second).get_statistics('m')
    w = whole.get_statistics('m')
    assert merged.params['weight'].count == w.params['weight'].count == 6 * 15
    ch, wch = merged.channels['output'], w.channels['output']
    assert ch['count'] == wch['count'] and ch['min'] == wch['min'] and same(ch['mean'], wch['mean']) and same(ch['std'], wch['std'])
    bad = first.state_dict()
    bad['streams'][0]['channels']['moments']['mean'] = bad['streams'][0]['channels']['moments']['mean'][:1]
    with pytest.raises(ValueError, match='channels'): StatisticsCollector().load_state_dict(bad)

    plain = StatisticsCollector(StatisticsConfig(collect_percentiles=[]))
    plain.update_statistics('m', None, xs[0])
    big = StatisticsCollector(StatisticsConfig(per_channel=True, collect_percentiles=[]))
    big.update_statistics('m', None, torch.zeros(2, 1000))
    assert big.memory_bytes == plain.memory_bytes + 1000 * 11 * 8
    tight = StatisticsCollector(StatisticsConfig(per_channel=True, collect_percentiles=[], max_memory_mb=0.05))
    with pytest.warns(ResourceWarning):
        tight.update_statistics('a', None, torch.zeros(2, 100))
        tight.update_statistics('b', None, torch.zeros(2, 1000))   # its 88 KB of channels do not fit
    assert tight.memory_bytes <= 0.05 * 2**20 and 'max_memory_mb' in tight.skipped['b.output']
    assert tight.get_statistics('a').channels['output']['count'] == [2] * 100


def test_bad_config_and_param_grads_without_attach():
    for kw, err in [(dict(collect_weights=1), TypeError), (dict(collect_param_grads='yes'), TypeError),
                    (dict(per_channel=1.5), TypeError), (dict(per_channel='1'), TypeError)]:
        with pytest.raises(err, match=list(kw)[0]): StatisticsConfig(**kw)
    assert StatisticsConfig(per_channel=-1).per_channel == -1
    c = ActivationStatisticsHook(StatisticsConfig(collect_param_grads=True))
    lin = nn.Linear(3, 2); lin._hook_name = 'lin'
    h = lin.register_forward_hook(c)          # a plain forward hook: no parameter hooks, said so
    lin(torch.randn(4, 3)).sum().backward()
    h.remove()
    assert 'attach' in c.skipped['lin.param_grad'] and c.get_statistics('lin').param_grads == {}
    assert 'attach' in c.export_statistics()['lin']['param_grads_reason']


def test_a_frozen_weight_gets_a_null_gradient_entry_with_its_reason():
    "collect_param_grads on a Linear whose weight is frozen: the bias's gradient statistics, the weight's entry null with why; all frozen: the reason for the module."
    m = nn.Sequential(nn.Linear(4, 3)); m[0].weight.requires_grad_(False)
    c = ActivationStatisticsHook(StatisticsConfig(collect_param_grads=True))
    with c.attach(m):
        m.train(); m(torch.randn(5, 4)).sum().backward()
    pg = c.export_statistics()['0']['param_grads']
    assert pg['bias']['count'] == 3 and pg['bias']['mean'] == 5.0            # d(sum)/d(bias) = the batch size, 5, for each of the 3
    assert pg['weight'] is None and pg['weight_reason'] == 'frozen: requires_grad is False, so it gets no gradient'
    m.requires_grad_(False)
    c = ActivationStatisticsHook(StatisticsConfig(collect_param_grads=True))
    with c.attach(m): m(torch.randn(5, 4))
    e = c.export_statistics()['0']
    assert e['param_grads'] == {} and 'frozen' in e['param_grads_reason']
