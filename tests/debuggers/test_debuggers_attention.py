"""AttentionDebugger per head and mask-aware (issue #31): the normalised entropy of a row is its entropy over log(its allowed keys),
the allowed keys given by `mask=` (True where a key may be attended) or, without one, read from the weights (> 0).
Real attention layers: nn.MultiheadAttention with key_padding_mask and a causal attn_mask, and BERT and GPT-2 built from configs
(eager attention, which returns its weights), made exactly uniform over their allowed keys by zeroing the query projection,
or exactly one-hot by keys far apart."""
import math, warnings

import pytest, torch
from torch import nn

from miniai.debuggers import AttentionDebugger, SequentialDebugger, load_pages

pytestmark = pytest.mark.usefixtures('one_thread')   # see conftest.py


class SelfAttn(nn.Module):
    "Self-attention with `nn.MultiheadAttention`, its per-head weights returned; masks as torch takes them (True: masked)."
    def __init__(self, mha, **kwargs): super().__init__(); self.attn, self.kwargs = mha, kwargs
    def forward(self, x): return self.attn(x, x, x, need_weights=True, average_attn_weights=False, **self.kwargs)[0]

def uniform_mha(d=8, heads=2):
    "An attention layer whose queries are all 0: every score is 0, so every row spreads its weight evenly over the keys it may attend."
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(d, heads, batch_first=True)
    with torch.no_grad(): mha.in_proj_weight[:d] = 0; mha.in_proj_bias[:d] = 0
    return mha

def padding(n_real=12, n=16, bs=2):
    "torch's key_padding_mask: the last n - n_real keys of item 1 are padding (True); item 0 has none."
    kpm = torch.zeros(bs, n, dtype=torch.bool); kpm[1, n_real:] = True
    return kpm

def stats(dbg, model, x): return dbg({'inputs': x}, model)['attention_stats']


def test_uniform_over_12_of_16_keys_reads_1_per_head():
    kpm = torch.ones(2, 16, dtype=torch.bool); kpm[:, :12] = False          # every row: 12 allowed keys of 16
    model, x = SelfAttn(uniform_mha(), key_padding_mask=kpm), torch.randn(2, 16, 8)
    for mask in (~kpm, (~kpm).long(), None):                                 # the mask given (bool or 0/1), or read from the weights
        st = stats(AttentionDebugger('attn', mask=mask), model, x)
        assert st['entropy'] == pytest.approx(math.log(12), rel=1e-6) and st['max_entropy'] == math.log(16)
        assert st['normalized_entropy'] == pytest.approx(1.0, abs=1e-6)
        assert st['normalized_entropy_per_head'] == pytest.approx([1.0, 1.0], abs=1e-6)
        assert st['max_attention_per_head'] == pytest.approx([1 / 12] * 2, rel=1e-6)
        assert st['allowed_keys'] == 12.0 and st['rows_without_choice'] == 0
    assert st['entropy_per_head'] == pytest.approx([math.log(12)] * 2, rel=1e-6)


def test_one_hot_rows_read_0_and_uniform_rows_1_in_one_batch():
    "Token i = 30 e_i, queries and keys the identity: row i's score on key i is 225 above the others, so its weights are exactly one-hot."
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 1, batch_first=True, bias=False)
    with torch.no_grad(): mha.in_proj_weight.copy_(torch.cat([torch.eye(16), torch.eye(16), torch.eye(16)]))
    x = 30 * torch.eye(16).expand(2, 16, 16)
    st = stats(AttentionDebugger('attn'), SelfAttn(mha), x)
    assert st['normalized_entropy'] == 0.0 and st['max_attention'] == 1.0 and st['allowed_keys'] == 1.0   # one-hot: one key above 0
    kpm = padding()                     # item 1: the keys of queries 12-15 are padding, so these rows spread evenly over the 12 others
    w = AttentionDebugger('attn', mask=~kpm)({'inputs': x}, SelfAttn(mha, key_padding_mask=kpm))
    assert torch.equal(w['attention_map'][1, 0, 12:, :12], torch.full((4, 12), 1 / 12))
    # 32 rows: 28 one-hot (0) and 4 uniform over their 12 allowed keys (1)
    assert w['attention_stats']['normalized_entropy'] == pytest.approx(4 / 32, abs=1e-7)
    assert w['attention_stats']['normalized_entropy_per_head'] == pytest.approx([4 / 32], abs=1e-7)


def test_causal_mask_and_the_first_query():
    causal = torch.ones(16, 16, dtype=torch.bool).triu(1)                   # torch's attn_mask: True above the diagonal is masked
    model, x = SelfAttn(uniform_mha(), attn_mask=causal), torch.randn(2, 16, 8)
    given = stats(AttentionDebugger('attn', mask=~causal[None]), model, x)
    assert given['normalized_entropy_per_head'] == pytest.approx([1.0, 1.0], abs=1e-6)
    assert given['rows_without_choice'] == 2 * 2                            # query 0 of each item and head has one key: left out
    assert given['allowed_keys'] == pytest.approx(8.5) and given['masked_weight'] == 0.0
    read = stats(AttentionDebugger('attn'), model, x)                       # from the weights, query 0 is a one-hot row: 0
    assert read['normalized_entropy_per_head'] == pytest.approx([15 / 16] * 2, abs=1e-6) and read['rows_without_choice'] == 0


def test_fully_masked_rows_are_left_out_without_nan():
    kpm = padding(n_real=0)                                                  # item 1: every key is padding, torch's weights are NaN
    model, x = SelfAttn(uniform_mha(), key_padding_mask=kpm), torch.randn(2, 16, 8)
    for mask in (~kpm, None):
        res = AttentionDebugger('attn', mask=mask)({'inputs': x}, model)
        assert res['attention_map'][1].isnan().all()
        st = res['attention_stats']
        assert st['normalized_entropy'] == pytest.approx(1.0, abs=1e-6) and st['normalized_entropy_per_head'] == pytest.approx([1.0, 1.0], abs=1e-6)
        assert st['rows_without_choice'] == 2 * 16 and st['allowed_keys'] == 16.0 and math.isfinite(st['max_attention_per_head'][0])
    class Zeros(nn.Module):                                                 # weights of 0 on a masked row, as some kernels return
        def forward(self, x): w = torch.full((1, 2, 4, 4), 0.25); w[0, 1] = 0; return w
    st = AttentionDebugger('')({'inputs': None}, Zeros())['attention_stats']
    assert st['normalized_entropy_per_head'][0] == pytest.approx(1.0) and math.isnan(st['normalized_entropy_per_head'][1])
    assert st['normalized_entropy'] == pytest.approx(1.0) and st['rows_without_choice'] == 4


def test_an_inverted_mask_is_reported():
    kpm = padding()
    model, x = SelfAttn(uniform_mha(), key_padding_mask=kpm), torch.randn(2, 16, 8)
    res = AttentionDebugger('attn', mask=kpm)({'inputs': x}, model)          # torch's mask (True: masked) given as it is
    assert res['attention_stats']['masked_weight'] == pytest.approx(1.0)
    assert 'mask=' in res['warning'] and '~mask' in res['warning']
    assert 'warning' not in AttentionDebugger('attn', mask=~kpm)({'inputs': x}, model)


def test_bad_masks_are_named():
    for bad in (torch.ones(2, 16), [1, 1, 0], 'causal'):
        with pytest.raises(TypeError, match='mask must be None or a bool or integer tensor'): AttentionDebugger('attn', mask=bad)
    dbg = AttentionDebugger('attn')
    with pytest.raises(TypeError, match='mask'): dbg.mask = torch.zeros(3, dtype=torch.float16)
    model, x = SelfAttn(uniform_mha()), torch.randn(2, 16, 8)
    for shape in ((3, 16), (2, 15), (5, 16, 16)):
        res = AttentionDebugger('attn', mask=torch.ones(shape, dtype=torch.bool))({'inputs': x}, model)
        assert 'mask of shape' in res['error'] and 'attention weights of shape [2, 2, 16, 16]' in res['error'], res


def _quiet_transformers():
    transformers = pytest.importorskip('transformers')
    transformers.logging.set_verbosity_error()
    return transformers

def test_bert_from_config_with_an_attention_mask():
    tr = _quiet_transformers()
    torch.manual_seed(0)
    bert = tr.BertModel(tr.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64, vocab_size=50,
                                      max_position_embeddings=16, attn_implementation='eager'))
    attn = bert.encoder.layer[1].attention.self
    with torch.no_grad(): attn.query.weight.zero_(); attn.query.bias.zero_()
    ids, am = torch.randint(0, 50, (2, 16)), torch.ones(2, 16, dtype=torch.long)
    am[:, 12:] = 0                                                          # 12 real tokens of 16
    dbg = AttentionDebugger('encoder.layer.1.attention.self', mask=am)
    res = dbg({'inputs': {'input_ids': ids, 'attention_mask': am}}, bert)
    st = res['attention_stats']
    assert res['attention_map'].shape == (2, 4, 16, 16) and st['max_entropy'] == math.log(16)
    assert st['entropy_per_head'] == pytest.approx([math.log(12)] * 4, rel=1e-6)
    assert st['normalized_entropy_per_head'] == pytest.approx([1.0] * 4, abs=1e-6) and st['masked_weight'] == 0.0
    # the other layer, at its random init: spread, but not evenly
    st0 = AttentionDebugger('encoder.layer.0.attention.self', mask=am)({'inputs': {'input_ids': ids, 'attention_mask': am}}, bert)['attention_stats']
    assert all(0.5 < h < 1 for h in st0['normalized_entropy_per_head']) and st0['masked_weight'] == 0.0


def test_gpt2_from_config_padding_and_causal_mask():
    tr = _quiet_transformers()
    torch.manual_seed(0)
    gpt = tr.GPT2Model(tr.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16, attn_implementation='eager'))
    with torch.no_grad(): gpt.h[0].attn.c_attn.weight[:, :32] = 0; gpt.h[0].attn.c_attn.bias[:32] = 0   # queries 0: uniform
    ids, am = torch.randint(0, 50, (2, 16)), torch.ones(2, 16, dtype=torch.long)
    am[1, 12:] = 0
    inputs = {'input_ids': ids, 'attention_mask': am}
    mask = am.bool()[:, None, :] & torch.ones(16, 16, dtype=torch.bool).tril()   # a decoder's mask: padding and causal together
    sd = SequentialDebugger(100, [{'name': n, 'debugger_config': {'class': AttentionDebugger, 'args': {'layer': f'h.{i}.attn', 'mask': m}}}
                                  for n, i, m in (('given', 0, mask), ('read', 0, None), ('h1', 1, mask))])
    res = sd({'inputs': inputs, 'outputs': None}, gpt)
    given, read = res['given']['attention_stats'], res['read']['attention_stats']
    assert given['normalized_entropy_per_head'] == pytest.approx([1.0] * 4, abs=1e-6) and given['masked_weight'] == 0.0
    assert given['rows_without_choice'] == 2 * 4                           # query 0 of each item and head
    assert read['allowed_keys'] == given['allowed_keys']                    # the weights show the same keys the mask allows
    h1 = res['h1']['attention_stats']
    assert all(0.5 < h < 1 for h in h1['normalized_entropy_per_head']) and 'warning' not in res['h1']
    assert len(h1['max_attention_per_head']) == 4 and all(1 / 16 < m <= 1 for m in h1['max_attention_per_head'])
    folder = sd.flush()                                                     # the per-head lists page as plain JSON
    assert load_pages(folder)[0]['results']['given']['attention_stats']['normalized_entropy_per_head'] == given['normalized_entropy_per_head']


def test_plot_draws_each_head_masked_keys_grey():
    import matplotlib; matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    kpm = padding()
    dbg = AttentionDebugger('attn', mask=~kpm)
    res = dbg({'inputs': torch.randn(2, 16, 8)}, SelfAttn(uniform_mha(), key_padding_mask=kpm))
    try:
        axs = dbg.plot(res, item=1)
        assert len(axs) == 2 and 'H/Hmax 1.00' in axs[0].get_title() and 'head 1' in axs[1].get_title()
        img = axs[0].images[0].get_array()
        assert img.mask[:, 12:].all() and not img.mask[:, :12].any()        # padding keys not drawn as weights
        assert len(dbg.plot(res, heads=[1])) == 1
        with pytest.raises(ValueError, match='item'): dbg.plot(res, item=2)
        with pytest.raises(ValueError, match='heads'): dbg.plot(res, heads=[2])
        with pytest.raises(ValueError, match='need_weights'):
            dbg.plot(AttentionDebugger('attn')({'inputs': torch.randn(2, 16, 8)}, SelfAttnNoWeights(uniform_mha())))
    finally: plt.close('all')

class SelfAttnNoWeights(nn.Module):
    def __init__(self, mha): super().__init__(); self.attn = mha
    def forward(self, x): return self.attn(x, x, x, need_weights=False)[0]


def test_heads_averaged_weights_one_map_and_one_normalised_entropy():
    "Weights averaged over heads (batch, queries, keys), nn.MultiheadAttention's default: no per-head lists, one map drawn."
    import matplotlib; matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    kpm = padding()
    class Avg(nn.Module):
        def __init__(self): super().__init__(); self.attn = uniform_mha()
        def forward(self, x): return self.attn(x, x, x, key_padding_mask=kpm)[0]
    dbg = AttentionDebugger('attn', mask=~kpm)
    res = dbg({'inputs': torch.randn(2, 16, 8)}, Avg())
    st = res['attention_stats']
    assert res['attention_map'].shape == (2, 16, 16) and 'normalized_entropy_per_head' not in st
    assert st['normalized_entropy'] == pytest.approx(1.0, abs=1e-6) and st['allowed_keys'] == 14.0   # 16 keys in item 0, 12 in item 1
    try:
        axs = dbg.plot(res, item=1)
        assert len(axs) == 1 and axs[0].get_title().startswith('attn\nH/Hmax 1.00')
    finally: plt.close('all')


def _gpt2(attn='eager'):
    tr = _quiet_transformers()
    torch.manual_seed(0)
    return tr.GPT2Model(tr.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=16, attn_implementation=attn))

def test_a_collapsed_head_is_flagged_and_its_healthy_peers_are_not():
    "GPT-2's head 2 in block 1 with its queries x100: its softmax turns nearly one-hot, and only it is flagged, with what to try."
    from miniai.findings import format_finding
    gpt, ids = _gpt2(), torch.randint(0, 50, (2, 16))
    mask = torch.ones(16, 16, dtype=torch.bool).tril()[None]
    healthy = AttentionDebugger('h.1.attn', mask=mask)({'inputs': ids}, gpt)
    assert healthy['findings'] == [] and min(healthy['attention_stats']['normalized_entropy_per_head']) > 0.9
    with torch.no_grad(): gpt.h[1].attn.c_attn.weight[:, 2 * 8:3 * 8] *= 100
    res = AttentionDebugger('h.1.attn', mask=mask)({'inputs': ids}, gpt)
    assert [(f['issue'], f['head']) for f in res['findings']] == [('collapsed head', 2)]
    text = format_finding(res['findings'][0])
    assert text.startswith('h.1.attn head 2 has collapsed: its normalised entropy') and 'check the init of its query and key weights' in text

def test_head_findings_collapsed_uniform_and_specialised_heads():
    from miniai.debuggers import head_findings
    assert head_findings('a', [0.9999, 0.9999, 0.57, 0.9999])[0]['head'] == 2          # far below heads at the maximum
    assert head_findings('a', [0.4, 0.8, 0.6, 0.7]) == []                               # trained heads of different widths
    assert head_findings('a', [0.3, 0.34, 0.2, 0.25]) == []                             # all sharp together: positional heads
    assert [(f['issue'], f['head']) for f in head_findings('a', [0.999, 0.4, 0.5, 0.45])] == [('uniform head', 0)]
    assert head_findings('a', [0.5]) == [] and head_findings('a', [math.nan, 0.5, 0.5]) == []

def test_hugging_face_sdpa_attention_names_eager():
    res = AttentionDebugger('h.0.attn')({'inputs': torch.randint(0, 50, (2, 16))}, _gpt2('sdpa'))
    assert "attn_implementation='eager'" in res['error'], res
