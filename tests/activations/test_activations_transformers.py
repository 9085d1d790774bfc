"""Transformer-aware diagnosis: `ActivationStats(hi='auto')` picks each series' histogram range from its first batch, so
that the `color_dim` images of a small GPT-2 and a small BERT (built from configs, random init, random token ids) have
structure, and `diagnose`'s verdict flags none of their layers, at either range. Lesson 10's absolute limits
(`relative=False`) still flag them at the fixed course range (`hi=10`, the default), as they flag the lesson-10 baseline;
`relative=True` judges each std against the layer's own scale. A real collapse is flagged by the verdict and by both."""
import math, warnings
import pytest, torch
from torch import nn
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt

transformers = pytest.importorskip('transformers')
from miniai.activations import ActivationStats, format_diagnosis, get_min
from miniai.activations import _auto_hi
from miniai.findings import format_finding

pytestmark = pytest.mark.usefixtures('one_thread')   # see conftest.py

PROBLEMS = {'vanishing', 'exploding', 'dead', 'saturated', 'sparse'}


def _quiet(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        transformers.logging.set_verbosity_error()
        return f(*args)


@pytest.fixture(scope='module')
def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0)
    return _quiet(transformers.GPT2LMHeadModel, cfg)


@pytest.fixture(scope='module')
def bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=256, max_position_embeddings=32)
    return _quiet(transformers.BertModel, cfg)


def train(model, cbs, n=3):
    "`n` training steps on random token ids, every callback in `cbs` attached."
    g = torch.Generator().manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        ctxs = [cb.attach(model) for cb in cbs]
        for c in ctxs: c.__enter__()
        try:
            for _ in range(n):
                out = model(torch.randint(0, 100, (4, 16), generator=g))
                y = out.logits if hasattr(out, 'logits') else out.last_hidden_state
                y.float().pow(2).mean().backward(); opt.step(); opt.zero_grad()
        finally:
            for c in reversed(ctxs): c.__exit__(None, None, None)
    return cbs


def nonempty_bins(rec): return int((rec.hists[0] > 0).sum())


def test_gpt2_at_init_not_flagged_with_auto_range(gpt2):
    auto_all, auto_blocks, fixed_blocks = ActivationStats(hi='auto'), ActivationStats('GPT2Block', hi='auto'), ActivationStats('GPT2Block')
    train(gpt2, [auto_all, auto_blocks, fixed_blocks])
    assert auto_blocks.names == ['transformer.h.0', 'transformer.h.1'] and len(auto_all.names) == 16
    for a in (auto_all, auto_blocks):
        rows = a.diagnose()
        assert rows and all(not PROBLEMS & set(r['flags']) for r in rows), format_diagnosis(rows)
        for name, rec in a.series().items():      # each series' own range: its first batch fills many bins
            assert nonempty_bins(rec) >= 15, (name, rec.hi, rec.hists[0])
            assert rec.overflow[0] <= 0.001 and rec.hi in {m * 10.**e for m in (1, 2, 5) for e in range(-4, 3)} or \
                   f'{rec.hi:g}'[0] in '125', (name, rec.hi)
    # the course's fixed range [0, 10): the residual stream (std about 0.03) fills one or two bins; the verdict does not read
    # the picture's bins and flags nothing, lesson 10's absolute limits call it vanishing and dead
    rows = fixed_blocks.diagnose()
    assert all(not PROBLEMS & set(r['flags']) for r in rows), format_diagnosis(rows)
    fixed = {r['layer']: r['flags'] for r in fixed_blocks.diagnose(relative=False)}
    assert all({'vanishing', 'dead'} <= set(f) for f in fixed.values()), fixed
    assert all(nonempty_bins(rec) <= 2 for rec in fixed_blocks.series().values())
    auto_blocks.color_dim()                   # each panel says its range
    assert [t.get_text() for t in auto_blocks.fig.axes[0].get_yticklabels()] == ['0', f"{auto_blocks.series()['transformer.h.0'].hi:g}"]
    auto_blocks.dead_chart()
    assert 'per layer' in auto_blocks.fig.axes[0].get_ylabel()
    plt.close('all')


def test_bert_intermediate_not_flagged_with_auto_range(bert):
    layers = ['encoder.layer.*.intermediate', 'encoder.layer.*.output.dense', 'embeddings.word_embeddings']
    auto, fixed = ActivationStats(layers, hi='auto'), ActivationStats(layers)
    train(bert, [auto, fixed])
    assert 'encoder.layer.0.intermediate' in auto.names
    rows = auto.diagnose()
    assert all(not PROBLEMS & set(r['flags']) for r in rows), format_diagnosis(rows)
    rows = fixed.diagnose()                     # the verdict is the same at the course's fixed range
    assert all(not PROBLEMS & set(r['flags']) for r in rows), format_diagnosis(rows)
    assert 'vanishing' in {r['layer']: r for r in fixed.diagnose(relative=False)}['encoder.layer.0.intermediate']['flags']
    assert all(nonempty_bins(rec) >= 15 for rec in auto.series().values())


def test_auto_hi_is_an_order_statistic_rounded_up():
    x = torch.arange(1, 1001, dtype=torch.float64) / 1000          # the 999th smallest |x| is 0.999
    assert _auto_hi(x) == 1.0 and _auto_hi(-x * 3) == 5.0 and _auto_hi(x * 0.0021) == 0.005 and _auto_hi(x * 150) == 200.
    assert _auto_hi(torch.tensor([0., 0., 0.])) == 1.0 and _auto_hi(torch.tensor([math.nan, math.inf])) == 1.0
    assert _auto_hi(torch.tensor([0.] * 2000 + [3.])) == 5.0        # mostly zeros: the largest |x| instead
    assert _auto_hi(torch.tensor([math.nan, 0.3, -math.inf], dtype=torch.bfloat16)) == 0.5
    assert _auto_hi(torch.tensor([2e-7], dtype=torch.float64)) == float('2e-7') and _auto_hi(torch.tensor([1e-3], dtype=torch.float64)) == float('1e-3')
    assert _auto_hi(torch.tensor([2e-7])) == float('5e-7')          # float32's 2e-7 lies just above the double 2e-7: exact, rounded up
    y = torch.randn(50, dtype=torch.float32); before = y.clone()
    _auto_hi(y); assert torch.equal(y, before)                    # only read


def collapse_run(collapse_at=6, n=10, hi='auto'):
    "A ReLU MLP whose middle layer's weights the user scales by 1e-3 (a real collapse) before forward `collapse_at`."
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    a = ActivationStats(nn.Linear, hi=hi)
    with a.attach(m):
        for i in range(n):
            if i == collapse_at:
                with torch.no_grad(): m[2].weight.mul_(1e-3); m[2].bias.zero_()
            m(torch.randn(64, 8)).sum().backward()
    return a


def test_a_collapse_is_still_flagged_relative_to_the_layer():
    a = collapse_run()
    # the verdict: the middle layer vanished against its own history (its peak std before the last batches); the others are ok
    rows = {r['layer']: r for r in a.diagnose()}
    assert rows['0']['flags'] == rows['4']['flags'] == [] and rows['2']['flags'] == ['vanishing'], format_diagnosis(list(rows.values()))
    f = next(f for f in rows['2']['findings'] if f['issue'] == 'vanishing')
    stds = a.series()['2'].stds
    assert f['evidence'] == 'history' and f['reference'] == max(stds[:-1]).item() and f['value'] == rows['2']['std']
    assert f['ratio'] == pytest.approx(f['reference'] / f['value']) and f['ratio'] > 1000 and f['value'] < f['threshold'] < f['reference']
    # no value of the collapsed layer is exactly zero: the verdict does not call it dead (the picture's lowest bin is not evidence)
    assert rows['2']['zeros'] == 0 and rows['2']['dead'] == 1.0 and 'dead' not in rows['2']['flags']
    # relative=True: the std against 0.1 x the layer's own peak, and "dead" by the first bin, as before the verdict
    rel = {r['layer']: r for r in a.diagnose(relative=True)}
    assert rel['0']['flags'] == [] and {'vanishing', 'dead'} <= set(rel['2']['flags'])
    f = next(f for f in rel['2']['findings'] if f['issue'] == 'vanishing')
    assert f['reference'] == max(stds[:-1]).item() and f['ratio'] == 0.1 and f['threshold'] == 0.1 * f['reference']
    assert 'below 0.1 x its peak std' in format_finding(f)
    # the range stays the one chosen at the first batch: the collapsed layer's values all fall in the first bin
    rec = a.series()['2']
    assert rec.hi == _auto_hi(torch.zeros(1)) or rec.hi > 0.1
    assert rec.dead[-1] == 1.0
    # relative=False judges the same run against the absolute limits: no reference scale
    assert [r['flags'] for r in a.diagnose(relative=False)] != [r['flags'] for r in a.diagnose(relative=True)]
    assert all('reference' not in f for r in a.diagnose(relative=False) for f in r['findings'])
    assert all('reference' not in f for r in collapse_run(hi=10.).diagnose(relative=False) for f in r['findings'])
    # the verdict does not depend on the picture's range: the fixed course range reads the same collapse
    assert {r['layer']: r['flags'] for r in collapse_run(hi=10.).diagnose()} == {n: r['flags'] for n, r in rows.items()}


def test_exploding_relative_to_the_first_batch():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    a = ActivationStats(hi='auto')
    with a.attach(m):
        for i in range(5):
            if i == 3:
                with torch.no_grad(): m[0].weight.mul_(1e3)
            m(torch.randn(16, 8))
    rows = {r['layer']: r for r in a.diagnose()}
    assert rows['0']['flags'] == ['exploding'] and rows['0']['findings'][0]['evidence'] == 'history', rows['0']
    assert rows['1']['flags'] == [] and rows['1']['downstream'] == '0'        # what follows it is reported as its consequence
    # its values now far beyond the range chosen at batch 0: a note about the picture, not a fault
    assert [(f['issue'], f['value']) for f in rows['0']['notes']] == [('overflow', 1.0)]
    assert "values beyond the histogram's range" in format_diagnosis(list(rows.values()))
    rel = {r['layer']: r for r in a.diagnose(relative=True)}        # against the first batch: exploding, and the overflow a note there too
    assert rel['0']['flags'] == ['exploding'] and [f['issue'] for f in rel['0']['notes']] == ['overflow'], rel['0']


def test_default_stays_the_course_range():
    "`ActivationStats()` keeps hi=10: the course's 40 bins of 0.25, `get_min` the exact fraction |x| < 0.25."
    torch.manual_seed(0)
    lin = nn.Linear(4, 64)
    a, model = ActivationStats(), nn.Sequential(lin)
    xs = [torch.randn(8, 4) for _ in range(2)]
    with a.attach(model):
        outs = [model(x) for x in xs]
    assert a.hi == 10. and a.series()['0'].hi == 10.
    want = torch.tensor([(o.detach().abs() < 0.25).double().mean().item() for o in outs])
    assert torch.equal(get_min(a.hooks[0]).double(), want.float().double())


def test_bad_arguments_named():
    with pytest.raises(ValueError, match='`hi`'): ActivationStats(hi='max')
    with pytest.raises(ValueError, match='`hi`'): ActivationStats(hi=-1)
    a = collapse_run(n=3)
    with pytest.raises(TypeError, match='`relative`'): a.diagnose(relative='yes')


def test_valid_series_take_the_training_range():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8))
    a = ActivationStats(hi='auto', on_valid=True)
    with a.attach(m):
        m(torch.randn(16, 8))
        m.eval(); m(torch.randn(16, 8) * 50); m.train()
    assert a.series('valid')['0'].hi == a.series()['0'].hi and a.series('valid')['0'].overflow[0] > 0.5
