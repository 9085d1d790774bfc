"""The verdict of `diagnose` on real small models: healthy ones read clean, an injected fault is named at its layer (with its
evidence and what to try) and what follows from it is marked downstream of it. Every model is built from its config."""
import math, re
import pytest, torch
from torch import nn
import torch.nn.functional as F

from miniai.activations import ActivationStats, format_diagnosis
from miniai.findings import format_finding, THRESHOLDS

pytestmark = pytest.mark.usefixtures('one_thread')   # see conftest.py


def train(model, batch, steps=8, lr=1e-3, sgd=False, layers=None, fault=None, **kw):
    "`ActivationStats` of `steps` optimizer steps of `model` (after `fault(model)`) on the batches `batch(generator)` makes."
    torch.manual_seed(0)
    if fault is not None:
        with torch.no_grad(): fault(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9) if sgd else torch.optim.AdamW(model.parameters(), lr=lr)
    a, g = ActivationStats(layers, **kw), torch.Generator().manual_seed(1)
    with a.attach(model):
        for _ in range(steps):
            batch(model, g).backward(); opt.step(); opt.zero_grad()
    return a

def flagged(a): return {r['layer']: r['flags'] for r in a.diagnose() if r['flags']}
def downstream(a): return {r['layer']: r['downstream'] for r in a.diagnose() if r['downstream']}
def scale(name, s): return lambda m: m.get_submodule(name).weight.mul_(s)

def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=32, n_head=2, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0))

def lm_batch(m, g):
    ids = torch.randint(0, 100, (4, 16), generator=g)
    return m(ids, labels=ids).loss

def test_gpt2_healthy_reads_clean_and_a_layer_x100_is_named():
    healthy = train(gpt2(), lm_batch)
    assert flagged(healthy) == {} and downstream(healthy) == {}
    projections = [r for r in healthy.diagnose() if r['layer'].endswith('c_proj')]
    assert len(projections) == 8 and all(r['std'] < 0.2 for r in projections)      # small by design, and not flagged
    assert any('vanishing' in r['flags'] for r in healthy.diagnose(relative=False))   # the absolute limits called them vanishing

    faulty = train(gpt2(), lm_batch, fault=scale('transformer.h.2.mlp.c_fc', 100))
    assert flagged(faulty) == {'transformer.h.2.mlp.c_fc': ['exploding']}
    assert downstream(faulty) == {'transformer.h.2.mlp.c_proj': 'transformer.h.2.mlp.c_fc'}
    row = next(r for r in faulty.diagnose() if r['layer'] == 'transformer.h.2.mlp.c_fc')
    text = format_finding(row['findings'][0])
    assert re.search(r"its std [\d.]+ is \d+x (its \d peers'|its peer's) \([\d.]+\): check the init of this layer", text), text

def bert():
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(num_hidden_layers=3, hidden_size=32, num_attention_heads=2, intermediate_size=128,
                                      vocab_size=100, max_position_embeddings=32))

def test_bert_healthy_reads_clean_and_its_intermediate_x100_is_named():
    assert flagged(train(bert(), lm_batch)) == {}
    name = 'bert.encoder.layer.1.intermediate.dense'
    faulty = train(bert(), lm_batch, fault=scale(name, 100))
    assert flagged(faulty) == {name: ['exploding']}
    assert set(downstream(faulty).values()) <= {name}

def resnet():
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)

def image_batch(m, g):
    return F.cross_entropy(m(torch.randn(8, 3, 32, 32, generator=g)), torch.randint(0, 10, (8,), generator=g))

def test_resnet_healthy_reads_clean_its_overflow_is_a_note_and_a_conv_x100_is_named():
    healthy = train(resnet(), image_batch, steps=4, lr=0.05, sgd=True)
    rows = healthy.diagnose()
    assert flagged(healthy) == {}
    assert any(r['notes'] for r in rows) and all(n['issue'] == 'overflow' for r in rows for n in r['notes'])   # beyond hi=10: a note
    assert 'note: values beyond the histogram' in format_diagnosis(rows)
    faulty = train(resnet(), image_batch, steps=4, lr=0.05, sgd=True, fault=scale('layer3.0.conv2', 100))
    assert flagged(faulty) == {'layer3.0.conv2': ['exploding']}

class MLP(nn.Module):
    "Blocks of fc -> act -> proj with a residual sum, as a transformer's MLPs."
    def __init__(self, n=4, d=16, act=nn.GELU):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.ModuleList(nn.Linear(d, 4 * d) for _ in range(n))
        self.act = nn.ModuleList(act() for _ in range(n))
        self.proj = nn.ModuleList(nn.Linear(4 * d, d) for _ in range(n))
        self.head = nn.Linear(d, 4)
    def forward(self, x):
        for fc, act, proj in zip(self.fc, self.act, self.proj): x = x + proj(act(fc(x)))
        return self.head(x)

def mlp_batch(m, g):
    return F.cross_entropy(m(torch.randn(32, 16, generator=g)), torch.randint(0, 4, (32,), generator=g))

def test_mlp_healthy_reads_clean():
    assert flagged(train(MLP(), mlp_batch)) == {}

def test_a_zero_initialised_layer_is_not_exploding():
    def lora_b(m): m.proj[2].weight.zero_(); m.proj[2].bias.zero_()       # zero at first, as LoRA's B
    a = train(MLP(), mlp_batch, fault=lora_b, steps=12, lr=1e-2)
    rows = {r['layer']: r for r in a.diagnose()}
    assert rows['proj.2']['std'] > 0 and 'exploding' not in rows['proj.2']['flags']

def test_behind_a_dead_gelu_the_projection_is_downstream_not_exploding():
    def dead(m): m.fc[1].bias.fill_(-100.)
    a = train(MLP(), mlp_batch, fault=dead, steps=12, lr=1e-2)
    assert flagged(a) == {'fc.1': ['dead']}
    rows = {r['layer']: r for r in a.diagnose()}
    assert 'exploding' not in rows['proj.1']['flags'] and rows['proj.1']['downstream'] in (None, 'fc.1')
    assert 'dead behind a ReLU' in format_finding(rows['fc.1']['findings'][0]) and 'check the bias' in format_finding(rows['fc.1']['findings'][0])

def cnn():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Conv2d(ni, nf, 3, stride=2 if i % 2 else 1, padding=1), nn.ReLU())
                           for i, (ni, nf) in enumerate([(1, 8), (8, 8), (8, 16), (16, 16), (16, 32)])],
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

def cnn_batch(m, g):
    return F.cross_entropy(m(torch.randn(16, 1, 16, 16, generator=g)), torch.randint(0, 10, (16,), generator=g))

def test_a_dead_relu_from_a_large_negative_bias_is_named_at_its_conv():
    assert flagged(train(cnn(), cnn_batch, lr=0.01, sgd=True)) == {}
    a = train(cnn(), cnn_batch, lr=0.01, sgd=True, fault=lambda m: m[2][0].bias.fill_(-50.))
    assert flagged(a) == {'2.0': ['dead']}
    relus = train(cnn(), cnn_batch, lr=0.01, sgd=True, layers=nn.ReLU, fault=lambda m: m[2][0].bias.fill_(-50.))   # the ReLUs: exact zeros
    assert flagged(relus) == {'2.1': ['dead']}
    assert format_finding(next(r for r in relus.diagnose() if r['layer'] == '2.1')['findings'][0]).startswith('2.1 is dead: 100.0% of its values are exactly 0')

def test_values_at_the_bounds_of_tanh_are_saturated():
    assert flagged(train(MLP(act=nn.Tanh), mlp_batch, layers=nn.Tanh)) == {}
    a = train(MLP(act=nn.Tanh), mlp_batch, layers=nn.Tanh, fault=scale('fc.1', 30))
    assert flagged(a) == {'act.1': ['saturated']}
    f = next(r for r in a.diagnose() if r['layer'] == 'act.1')['findings'][0]
    assert f['value'] > 0.8 and 'pile at its bounds [-1, 1]' in format_finding(f)

class NaNAt(nn.Module):
    "Identity, until forward `at`, from which its output is NaN in one place."
    def __init__(self, at): super().__init__(); self.at, self.n, self.lin = at, 0, nn.Linear(16, 16)
    def forward(self, x):
        self.n += 1
        y = self.lin(x)
        if self.n > self.at: y = y.clone(); y[0, 0] = math.nan
        return y

def test_a_nan_born_in_one_layer_is_named_there_and_the_rest_is_downstream():
    m = MLP(); m.fc[2] = nn.Sequential(NaNAt(4), m.fc[2])
    a = ActivationStats(layers=[n for n, _ in m.named_modules() if n.startswith(('fc.', 'proj.', 'head')) and n.count('.') == 1 or n == 'fc.2.0'])
    g = torch.Generator().manual_seed(1)
    with a.attach(m), torch.no_grad():
        for _ in range(8): m(torch.randn(32, 16, generator=g))
    assert flagged(a) == {'fc.2.0': ['nonfinite values']}
    assert set(downstream(a).values()) == {'fc.2.0'} and 'proj.3' in downstream(a)
    assert format_diagnosis(a.diagnose()).splitlines()[-1] == 'first NaN/Inf: layer fc.2.0, batch 4 (of the recorded batches, from 0)'

def test_a_learning_rate_that_diverges_names_the_model_and_lowering_it():
    a = train(cnn(), cnn_batch, steps=30, lr=20., sgd=True)
    rows = a.diagnose()
    assert [(r['layer'], r['flags']) for r in rows if r['flags']] == [('', ['exploding'])], format_diagnosis(rows)   # the model, not a layer
    assert all(r['downstream'] == '' for r in rows[1:]) and format_diagnosis(rows).splitlines()[1].startswith('(the model)')
    text = format_finding(rows[0]['findings'][0])
    assert text.startswith('the model diverged: the std of 6 of its 6 layers grew over 100x') and 'lower the learning rate' in text, text
    healthy = train(cnn(), cnn_batch, steps=30, lr=0.01, sgd=True)
    assert all(r['layer'] for r in healthy.diagnose())      # a run that trains has no row for the model

def test_format_diagnosis_keeps_numbers_in_their_columns():
    base = dict(mean=0.5, std=1., dead=0.1, zeros=0., overflow=0., nonfinite=0, flags=[], findings=[], notes=[], downstream=None)
    rows = [dict(base, layer='x'), dict(base, layer='a.very.long.name.of.a.layer.deep.inside', mean=-1.23456e-7, std=2.5e7),
            dict(base, layer='n', mean=math.nan, std=math.inf, dead=math.nan, nonfinite=123456789012, flags=['no finite values']),
            dict(base, layer='neg', mean=-98765.4, std=-0.0)]
    lines = format_diagnosis(rows).splitlines()
    header = lines[0]
    for col in ('mean', 'std', 'dead', 'zeros', 'over', 'NaN/Inf'):
        end = header.index(col) + len(col)
        for line in lines[1:]:
            assert line[end - 1] != ' ' and line[end] == ' ', (col, line)     # every number ends where its header ends

def test_old_keywords_still_work():
    a = train(gpt2(), lm_batch, steps=3)
    assert flagged(a) == {}
    with pytest.warns(DeprecationWarning, match='overflow='):
        assert a.diagnose(saturated=0.2) == a.diagnose(overflow=0.2)     # the note's limit, by its old name
    assert any(r['flags'] for r in a.diagnose(relative=False))            # the absolute limits, on request
    a.diagnose(relative=True); a.diagnose(thresholds=THRESHOLDS.but(peers=None, vanishing_std=0.1))

def test_a_frozen_layer_and_a_detached_one_get_no_gradient_at_their_layer():
    def frozen(m): m.proj[1].requires_grad_(False)
    a = train(MLP(), mlp_batch, fault=frozen, param_grads=True)
    assert flagged(a) == {'proj.1': ['no gradient']}
    assert 'proj.1 is frozen: none of its parameters requires grad' in format_finding(next(r for r in a.diagnose() if r['layer'] == 'proj.1')['findings'][0])
    def detached(m): m.fc[2].register_forward_hook(lambda mod, args, out: out.detach())
    b = train(MLP(), mlp_batch, fault=detached, param_grads=True)
    assert flagged(b) == {'fc.2': ['no gradient']}
    assert flagged(train(MLP(), mlp_batch, param_grads=True)) == {}
