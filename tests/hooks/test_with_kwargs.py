"""Keyword inputs: a forward hook sees a forward's keyword tensors only when asked (`with_kwargs=True`, or a list
of names), as further input streams named by their keyword; without it the hooks see the positional inputs alone, as before,
so an additive attention mask (-inf) is never read as an activation unless the user names it. Tiny modules, no compile."""
import warnings
import pytest, torch
from torch import nn

from miniai.hooks import Hook, Hooks, HooksCallback, KwInputs, tensor_items
from miniai.activations import ActivationStats

pytestmark = pytest.mark.usefixtures('one_thread')

class Scaled(nn.Module):
    "A layer with a keyword tensor input, as a transformer block's `attention_mask`."
    def __init__(self): super().__init__(); self.lin = nn.Linear(4, 4)
    def forward(self, x, *, scale=None, bias=None, flag=False): return self.lin(x) * (1 if scale is None else scale) + (0 if bias is None else bias)

def keys(inp): return [k for k, _ in tensor_items(inp)]

def test_keyword_tensors_are_input_streams_when_asked():
    m, x, scale, bias = Scaled(), torch.randn(3, 4), torch.full((1, 4), 2.), torch.ones(4)
    seen = []
    def f(hook, mod, inp, out): seen.append((type(inp), keys(inp), tuple(inp)))
    with Hook(m, f): m(x, scale=scale, bias=bias)                                   # default: the positional inputs only
    with Hook(m, f, with_kwargs=True): m(x, scale=scale, bias=bias, flag=True)        # every keyword (the bool has no tensor)
    with Hook(m, f, with_kwargs=['bias']): m(x, scale=scale, bias=bias)              # those named
    with Hook(m, f, with_kwargs='bias'): m(x)                                         # named but not given: none
    assert [s[:2] for s in seen] == [(tuple, ['0']), (KwInputs, ['0', 'scale', 'bias']), (KwInputs, ['0', 'bias']), (KwInputs, ['0'])]
    assert all(s[2][0] is x for s in seen)            # `inp[0]`, `len(inp)`, unpacking: the positional tuple as before
    with Hook(m, lambda h, mod, inp, out: seen.append(inp), with_kwargs=True): m(x, scale=scale, bias=bias)
    assert seen[-1].kwargs['scale'] is scale and seen[-1].kwargs['bias'] is bias and len(seen[-1]) == 1
    assert not m._forward_hooks
    # torch's own hook arguments still pass through, and `Hooks` and the callback take the option
    with Hooks([m], f, with_kwargs=['scale'], prepend=True) as hs: m(x, scale=scale)
    assert seen[-1][1] == ['0', 'scale'] and hs[0].removed
    cb = HooksCallback(f, layers=[m], with_kwargs=['scale'])
    with cb.attach(m): m(x, scale=scale, bias=bias)
    assert seen[-1][1] == ['0', 'scale'] and cb.calls == {'Scaled': 1} and not m._forward_hooks


def test_multihead_attention_masks_only_when_named():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8)
    pad = torch.zeros(2, 5).masked_fill(torch.tensor([[False] * 5, [False] * 3 + [True] * 2]), float('-inf'))   # additive masks:
    causal = nn.Transformer.generate_square_subsequent_mask(5)                                                   # -inf where masked
    got = {}
    def f(hook, mod, inp, out): got[hook.name] = {k: t for k, t in tensor_items(inp)}
    for opt, name in ((False, 'off'), (True, 'all'), (['key_padding_mask'], 'pad')):
        with Hook(mha, f, name=name, with_kwargs=opt): mha(x, x, x, key_padding_mask=pad, attn_mask=causal, need_weights=False)
    assert list(got['off']) == ['0', '1', '2']                                     # the masks are not read unless asked for
    assert list(got['all']) == ['0', '1', '2', 'key_padding_mask', 'attn_mask'] and got['all']['attn_mask'] is causal
    assert list(got['pad']) == ['0', '1', '2', 'key_padding_mask'] and got['pad']['key_padding_mask'] is pad
    # ActivationStats records outputs: the mask given as a keyword changes nothing it records
    st = ActivationStats(layers=[mha])
    with st.attach(mha): mha(x, x, x, key_padding_mask=pad, attn_mask=causal)
    recs = st.recorders['train']['MultiheadAttention']
    assert list(recs) == ['output', 'output[1]'] and abs(float(recs['output'].means[0])) < 10 and recs['output[1]'].n_batches == 1


def test_bad_with_kwargs_is_refused_naming_the_argument():
    m = Scaled()
    for bad in (1, [3], [''], {'scale': 1}, 'scale'.encode()):
        with pytest.raises(TypeError, match=r"`with_kwargs` is True, False or a list of keyword names"): Hook(m, lambda *a: None, with_kwargs=bad)
        with pytest.raises(TypeError, match=r"HooksCallback: `with_kwargs`"): HooksCallback(lambda *a: None, with_kwargs=bad)
    assert not m._forward_hooks

def test_the_collector_records_keyword_inputs_it_is_asked_for():
    "`ActivationStatisticsHook.attach(with_kwargs=...)`: a named keyword tensor is a stream `inputs['scale']` with its exact mean; not named, none."
    from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
    class Wrap(nn.Module):
        def __init__(self): super().__init__(); self.s = Scaled()
        def forward(self, x, scale): return self.s(x, scale=scale)
    model, x, scale = Wrap(), torch.randn(3, 4), torch.tensor([[1., 2., 3., 5.]])
    for kw, want in ((False, ['0']), (['scale'], ['0', 'scale'])):
        col = ActivationStatisticsHook(StatisticsConfig())
        with col.attach(model, ['s'], with_kwargs=kw): model(x, scale)
        st = col.get_statistics('s')
        assert list(st.inputs) == want, (kw, list(st.inputs))
        if 'scale' in want: assert st.inputs['scale'].mean == 2.75 and st.inputs['scale'].max == 5.
