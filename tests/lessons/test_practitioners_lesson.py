"""The claims of lesson 10g (diagnosing a practitioner's model) on real runs, smaller than the lesson's: torchvision's ResNet-18 and a
GPT-2 from `transformers`, both built from configs (random init, nothing downloaded), recorded by `with astats.attach(model):` around a
plain PyTorch loop, their layers picked by glob patterns; the attention of GPT-2's heads read per head with its mask."""
import math

import pytest, torch
import torch.nn.functional as F

from miniai.hooks import select_modules
from miniai.activations import ActivationStats, format_diagnosis
from miniai.debuggers import AttentionDebugger

pytestmark = pytest.mark.usefixtures('one_thread')   # see conftest.py
torchvision = pytest.importorskip('torchvision')
transformers = pytest.importorskip('transformers')
transformers.logging.set_verbosity_error()


def hooks_left(model): return [n for n, m in model.named_modules() if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks]

def fashion_batches(n=3, bs=16):
    "Fashion-MNIST upsampled to 32 pixels on 3 channels, as in the lesson (its black background pixels are exactly 0)."
    from miniai.datasets import fashion_dls
    try: dls = fashion_dls(bs)
    except (FileNotFoundError, OSError) as e: pytest.skip(f'Fashion-MNIST is not on this machine: {e}')
    it = iter(dls.train)
    return [(F.interpolate(xb, size=32, mode='bilinear').expand(-1, 3, -1, -1), yb) for xb, yb in (next(it) for _ in range(n))]


def test_resnet18_twenty_convs_recorded_and_healthy():
    batches = fashion_batches()
    torch.manual_seed(42)
    model = torchvision.models.resnet18(num_classes=10)
    layers = ['conv1', 'layer*.*.conv*', 'layer*.*.downsample.0']
    assert len(select_modules(model, layers)) == 20
    astats = ActivationStats(layers, hi='auto')
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with astats.attach(model):
        for xb, yb in batches:
            F.cross_entropy(model(xb), yb).backward(); opt.step(); opt.zero_grad()
    assert not hooks_left(model)
    series = astats.series()
    assert len(series) == 20 and all(r.n_batches == 3 for r in series.values())
    rows = astats.diagnose()
    assert not any(r['flags'] for r in rows), format_diagnosis(rows)
    by = {r['layer']: r for r in rows}
    # conv1 (no bias) outputs exactly 0 over the black background: a third of its values in the lowest bin, the others much less
    assert by['conv1']['dead'] > 0.3 and all(r['dead'] < 0.25 for r in rows[1:])
    # the first conv of a block reads the residual stream, the second a batchnormed ReLU: a larger std, in all eight blocks
    assert all(by[f'layer{s}.{b}.conv1']['std'] > by[f'layer{s}.{b}.conv2']['std'] for s in range(1, 5) for b in range(2))
    assert '  layer2.0.downsample.0' not in format_diagnosis(rows) and 'layer2.0.downsample.0 ' in format_diagnosis(rows)


def patterns(bs=32, n=16, period=4): return torch.randint(0, 64, (bs, period)).repeat(1, n // period)

GPT_LAYERS = ['transformer.wte', 'transformer.wpe', 'transformer.h.*.ln_?', 'transformer.h.*.attn.c_*',
              'transformer.h.*.mlp.c_*', 'transformer.h.*.mlp.act', 'transformer.ln_f', 'lm_head']

def train(model, opt, steps, lr):
    for g in opt.param_groups: g['lr'] = lr
    for _ in range(steps):
        ids = patterns()
        loss = model(ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad()
    return loss.item()


def test_gpt2_healthy_at_init_heads_focus_after_training():
    torch.manual_seed(0)
    gpt = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=64, n_positions=16,
                                                               attn_implementation='eager'))
    opt = torch.optim.AdamW(gpt.parameters(), lr=1e-4)
    auto, fixed = ActivationStats(GPT_LAYERS, hi='auto'), ActivationStats(GPT_LAYERS)
    wstats = ActivationStats('transformer.h.*.mlp.c_*', hi='auto', weights=True, param_grads=True)
    with auto.attach(gpt), fixed.attach(gpt), wstats.attach(gpt): first = train(gpt, opt, 4, lr=1e-4)
    assert not hooks_left(gpt) and len(auto.series()) == 25
    rows = auto.diagnose()
    assert not any(r['flags'] for r in rows), format_diagnosis(rows)              # healthy layers of every scale: nothing flagged
    rows = fixed.diagnose()                                                         # the verdict reads the same at the course's range
    assert not any(r['flags'] for r in rows), format_diagnosis(rows)
    old = {r['layer']: r['flags'] for r in fixed.diagnose(relative=False)}          # lesson 10's absolute thresholds flag them
    grads = {n: float(r.stats[1][-1]) for n, r in wstats.params(grads=True).items() if n.endswith('weight')}
    assert len(grads) == 6 and not any(r['flags'] for r in wstats.diagnose())   # the gradient reaches every block alike
    assert all(0.5 < grads[f'transformer.h.{b}.mlp.{k}.weight'] / grads[f'transformer.h.0.mlp.{k}.weight'] < 2 for b in (1, 2) for k in ('c_fc', 'c_proj'))
    assert all(old[n] for n in ('transformer.wte', 'transformer.wpe', 'transformer.h.0.attn.c_proj', 'transformer.h.2.mlp.c_proj')), old

    ids = patterns(4)
    am = torch.ones(4, 16, dtype=torch.long); am[2:, 12:] = 0
    mask = am.bool()[:, None, :] & torch.ones(16, 16, dtype=torch.bool).tril()
    batch = {'inputs': {'input_ids': ids, 'attention_mask': am}}
    dbgs = [AttentionDebugger(f'transformer.h.{i}.attn', mask=mask) for i in range(3)]
    before = [d(batch, gpt)['attention_stats'] for d in dbgs]
    assert all(0.9 < h <= 1 for st in before for h in st['normalized_entropy_per_head'])
    last = train(gpt, opt, 100, lr=3e-3)
    after = [d(batch, gpt) for d in dbgs]
    assert last < math.log(64) / 2.5 < first
    assert all(h < 0.35 for h in after[0]['attention_stats']['normalized_entropy_per_head'])
    assert all(h > 0.4 for r in after[1:] for h in r['attention_stats']['normalized_entropy_per_head'])
    w = after[0]['attention_map']
    for o in (3, 7): assert all(torch.stack([w[:, h, q, q - o] for q in range(o, 12)]).mean() > 0.3 for h in range(4))
    assert all('warning' not in r and r['attention_stats']['masked_weight'] == 0 for r in after)
    inverted = AttentionDebugger('transformer.h.0.attn', mask=~mask)(batch, gpt)
    assert 'mask=' in inverted['warning']
