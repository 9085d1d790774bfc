"""miniai.trainers: the Lightning and Hugging Face callbacks record exactly the batches trained, keep training and validation
apart, count optimizer steps under gradient accumulation when asked, and leave no hook behind, also when training raises.
Tiny models built from configs, CPU only, nothing downloaded."""
import sys, tempfile, warnings, logging
import pytest, torch
import torch.nn.functional as F
from torch import nn
from miniai.activations import ActivationStats
from miniai.hooks import HooksCallback, CalledTwiceWarning
from miniai.monitoring import StatisticsCB
from miniai.trainers import lightning_callback, hf_callback

pytestmark = pytest.mark.usefixtures('one_thread')   # tiny models run many times faster on one torch thread (see conftest)

def n_hooks(model):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())

def counts(astats, phase): return [len(rec) for rec in astats.series(phase).values()]

def test_import_is_light():
    "Executing miniai.trainers imports neither trainer library: they are optional extras, imported when a callback is first made."
    import importlib, miniai.trainers
    libs = ('lightning', 'pytorch_lightning', 'transformers', 'accelerate')
    def loaded(): return sorted(m for m in sys.modules if m.split('.')[0] in libs)
    saved = {m: sys.modules.pop(m) for m in loaded()}     # as if none was imported yet (this process may have imported them)
    try:
        importlib.reload(miniai.trainers)
        assert loaded() == []
    finally:
        for m in loaded(): del sys.modules[m]
        sys.modules.update(saved)

def test_bad_arguments():
    with pytest.raises(TypeError, match='`cb` must be a miniai HooksCallback'): lightning_callback(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="`count` must be 'forwards'"): hf_callback(ActivationStats(), count='steps')

# ---------------------------------------------------------------- PyTorch Lightning

@pytest.fixture(scope='module')
def L():
    pl = pytest.importorskip('lightning.pytorch')
    logging.getLogger('lightning.pytorch').setLevel(logging.ERROR)

    class Net(pl.LightningModule):
        def __init__(self, fail_at=None):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
            self.fail_at = fail_at
        def forward(self, x): return self.net(x)
        def training_step(self, batch, batch_idx):
            if batch_idx == self.fail_at: raise RuntimeError(f'batch {batch_idx} fails')
            return F.mse_loss(self(batch[0]), batch[1])
        def validation_step(self, batch, batch_idx): return F.mse_loss(self(batch[0]), batch[1])
        def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)

    def dl(n, bs=2):   # batch k holds the value k in every input: a recorded input says which batch it was
        x = torch.arange(float(n)).repeat_interleave(bs)[:, None].expand(-1, 4)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.zeros(n * bs, 1)), batch_size=bs)

    def fit(*cbs, model=None, val=None, **kwargs):
        model, kwargs = model or Net(), {'num_sanity_val_steps': 0, **kwargs}
        with warnings.catch_warnings():
            warnings.filterwarnings('ignore', '.*(does not have many workers|no `val_dataloader`|LeafSpec).*')
            pl.Trainer(accelerator='cpu', logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                       callbacks=list(cbs), **kwargs).fit(model, dl(8), val)
        return model
    return fit, Net, dl

def test_lightning_counts_train_and_valid_apart(L):
    "Lightning's sanity check (2 batches, not recorded), 4 steps, a validation epoch of 3 batches: 4 training and 3 validation batches per layer, apart."
    fit, Net, dl = L
    astats = ActivationStats(on_valid=True)
    model = fit(lightning_callback(astats), val=dl(3), max_steps=4, limit_train_batches=4, num_sanity_val_steps=2)
    assert astats.names == ['net.0', 'net.2']
    assert counts(astats, 'train') == [4, 4] and counts(astats, 'valid') == [3, 3]
    assert n_hooks(model) == 0
    astats = ActivationStats()    # without on_valid: the training batches only
    fit(lightning_callback(astats), val=dl(3), max_steps=4, limit_train_batches=4)
    assert counts(astats, 'train') == [4, 4] and counts(astats, 'valid') == []

def test_lightning_statistics_cb(L):
    "Any HooksCallback: StatisticsCB's collector sees each of the 2 layers once per step."
    fit = L[0]
    cb = StatisticsCB(layers=nn.Linear)
    fit(lightning_callback(cb), max_steps=3)
    assert cb.stats.call_count == 2 * 3

def test_lightning_statistics_cb_keeps_phases_apart(L):
    "Lightning validates inside the training epoch (before its end): 2 epochs of 4 training and 2 validation batches give 4, 2, 4, 2 per phase, never 6."
    fit, Net, dl = L
    cb = StatisticsCB(layers=nn.Linear, per_epoch=True, on_valid=True)
    fit(lightning_callback(cb), val=dl(2), max_epochs=2, limit_train_batches=4)
    got = sorted(zip(cb.history_phases, [h['net.0'].n_updates for h in cb.history]))
    assert got == [('train', 4), ('train', 4), ('valid', 2), ('valid', 2)]

def test_lightning_second_fit_says_what_it_drops(L):
    "One ActivationStats given to a second Trainer.fit: as with the Learner, the second fit starts a new recording; the 4 batches of the first, never read, are named in a warning, not dropped silently. Read before, no warning."
    fit = L[0]
    astats = ActivationStats()
    fit(lightning_callback(astats), max_steps=4)
    assert counts(astats, 'train') == [4, 4]
    with pytest.warns(UserWarning, match='the 4 batches the previous one recorded were never read'):
        fit(lightning_callback(astats), max_steps=3)
    assert counts(astats, 'train') == [3, 3]
    astats.diagnose()                                   # read: the next fit drops nothing unread
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        warnings.filterwarnings('ignore', '.*(does not have many workers|no `val_dataloader`|LeafSpec).*')
        fit(lightning_callback(astats), max_steps=2)
    assert counts(astats, 'train') == [2, 2]

def _seen(fit, count, every=2):
    "The batches (by number) whose forward `every` and `count` record, over 4 optimizer steps of 2 micro-batches."
    seen = []
    cb = HooksCallback(lambda hook, mod, inp, outp: seen.append(int(inp[0][0, 0])), layers='net.0', every=every)
    with warnings.catch_warnings():
        warnings.simplefilter('error', CalledTwiceWarning)   # each micro-batch is a forward of its own, not a layer called twice
        fit(lightning_callback(cb, count=count), max_steps=4, accumulate_grad_batches=2)
    assert cb.every == every       # given back after the fit
    return seen

def test_lightning_gradient_accumulation(L):
    "Batches 0-7, every=2: forwards 0, 2, 4, 6; with count='optimizer_steps', steps 0 and 2: all their micro-batches."
    fit = L[0]
    assert _seen(fit, 'forwards') == [0, 2, 4, 6]
    assert _seen(fit, 'optimizer_steps') == [0, 1, 4, 5]
    assert _seen(fit, 'optimizer_steps', every=3) == [0, 1, 6, 7]

def test_lightning_raise_leaves_no_hook(L):
    "Training batch 2 raises: Lightning's on_exception removes every hook; the two batches recorded before it stay."
    fit, Net, dl = L
    model = Net(fail_at=2)
    before, during = n_hooks(model), []
    astats = ActivationStats()
    cb = lightning_callback(astats)
    probe = lightning_callback(HooksCallback(lambda hook, *a: during.append(n_hooks(model)), layers='net.2'))
    with pytest.raises(RuntimeError, match='batch 2 fails'): fit(cb, probe, model=model, max_steps=4)
    assert during and min(during) >= before + 2 + 1 and not cb.recording
    assert n_hooks(model) == before
    assert counts(astats, 'train') == [2, 2]

# ---------------------------------------------------------------- Hugging Face Trainer

@pytest.fixture(scope='module')
def H():
    transformers = pytest.importorskip('transformers')
    pytest.importorskip('accelerate')
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, TrainerCallback
    transformers.logging.set_verbosity_error()
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)
    def gpt():
        torch.manual_seed(0)
        return GPT2LMHeadModel(config)
    def tokens(n, first=0):   # sequence i starts with token first+i: its first token says which one it is
        ids = (torch.arange(first, first + n)[:, None] + torch.arange(8)) % 64
        return [dict(input_ids=t, labels=t) for t in ids]

    class FailAtStep(TrainerCallback):
        def __init__(self, step): self.step = step
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == self.step: raise RuntimeError(f'step {self.step} fails')

    def trainer(model, *cbs, eval_n=0, **kwargs):
        args = TrainingArguments(tempfile.mkdtemp(), report_to=[], save_strategy='no', use_cpu=True, disable_tqdm=True,
                                 logging_strategy='no', per_device_train_batch_size=2, per_device_eval_batch_size=2, **kwargs)
        return Trainer(model=model, args=args, train_dataset=tokens(32), eval_dataset=tokens(eval_n, first=40) if eval_n else None,
                       callbacks=list(cbs))
    return gpt, trainer, FailAtStep

LAYERS = 'transformer.h.*.mlp.c_fc'

def test_hf_counts_train_and_valid_apart(H):
    "4 steps, an evaluation of 2 batches after steps 2 and 4: 4 training and 4 validation batches per layer, apart."
    gpt, trainer, _ = H
    model, astats = gpt(), ActivationStats(LAYERS, on_valid=True)
    before = n_hooks(model)
    with hf_callback(astats) as cb: trainer(model, cb, max_steps=4, eval_n=4, eval_strategy='steps', eval_steps=2).train()
    assert astats.names == ['transformer.h.0.mlp.c_fc', 'transformer.h.1.mlp.c_fc']
    assert counts(astats, 'train') == [4, 4] and counts(astats, 'valid') == [4, 4]
    assert n_hooks(model) == before and not cb.recording

def test_hf_gradient_accumulation(H):
    "8 micro-batches in 4 optimizer steps, every=2: with count='optimizer_steps' the micro-batches of steps 0 and 2, each a forward of its own."
    gpt, trainer, _ = H
    for count, picked in (('forwards', [0, 2, 4, 6]), ('optimizer_steps', [0, 1, 4, 5])):
        model, trained, seen = gpt(), [], []
        model.register_forward_pre_hook(lambda m, args, kwargs: trained.append(kwargs['input_ids'][:, 0].tolist()) if m.training else None,
                                        with_kwargs=True)        # every training forward, in the shuffled order the Trainer runs them
        cb = HooksCallback(lambda hook, mod, inp, outp: seen.append(inp[0][:, 0].tolist()), layers='transformer.wte', every=2)
        with warnings.catch_warnings():
            warnings.simplefilter('error', CalledTwiceWarning)
            with hf_callback(cb, count=count) as hcb: trainer(model, hcb, max_steps=4, gradient_accumulation_steps=2).train()
        assert len(trained) == 8
        assert seen == [trained[i] for i in picked], count

def test_hf_raise_inside_with_leaves_no_hook(H):
    "Training raises after step 2: leaving the `with` block removes every hook (the Trainer calls no callback on errors); the 2 steps stay."
    gpt, trainer, FailAtStep = H
    model, astats = gpt(), ActivationStats(LAYERS)
    before = n_hooks(model)
    with pytest.raises(RuntimeError, match='step 2 fails'):
        with hf_callback(astats) as cb:
            t = trainer(model, cb, FailAtStep(2), max_steps=4)
            try: t.train()
            finally: during = n_hooks(model)
    assert during == before + 2 + 2                 # the two layers' hooks and the model's two: there, until the block ended
    assert n_hooks(model) == before and not cb.recording
    assert counts(astats, 'train') == [2, 2]

def test_hf_stale_recording_closed_at_next_train(H):
    "Without `with`, a run that raised leaves its hooks until the next `on_train_begin`, which removes them before hooking again."
    gpt, trainer, FailAtStep = H
    model, astats = gpt(), ActivationStats(LAYERS)
    before, cb = n_hooks(model), hf_callback(astats)
    with pytest.raises(RuntimeError, match='step 1 fails'): trainer(model, cb, FailAtStep(1), max_steps=4).train()
    assert cb.recording and n_hooks(model) == before + 4
    trainer(model, cb, max_steps=3).train()
    assert n_hooks(model) == before and not cb.recording
    assert counts(astats, 'train') == [3, 3]       # the new run's, recorded afresh

def test_hf_statistics_cb_keeps_phases_apart(H):
    "Evaluations every 6 steps, in the middle of the epochs of 16 steps (2 epochs): the training epochs stay whole (16 and 16), each evaluation an entry of its own."
    gpt, trainer, _ = H
    model, cb = gpt(), StatisticsCB(layers=LAYERS, per_epoch=True, on_valid=True)
    with hf_callback(cb) as hcb:
        trainer(model, hcb, num_train_epochs=2, eval_n=4, eval_strategy='steps', eval_steps=6).train()
    name = 'transformer.h.0.mlp.c_fc'
    train = [h[name].n_updates for h, p in zip(cb.history, cb.history_phases) if p == 'train']
    valid = [h[name].n_updates for h, p in zip(cb.history, cb.history_phases) if p == 'valid']
    assert train == [16, 16] and len(valid) >= 5 and all(v == 2 for v in valid)     # at steps 6, 12, ..., 30 (and the end); 4 eval sequences in batches of 2

def test_a_callback_given_straight_to_a_trainer_says_how_to_wrap_it(L, H):
    "ActivationStats is a callback of miniai's Learner: Lightning and the HF Trainer ask it for their own events, and the error names the wrappers."
    fit = L[0]
    with pytest.raises(AttributeError, match=r"no `on_.*lightning_callback\(cb\).*hf_callback\(cb\)"): fit(ActivationStats(), max_steps=1)
    gpt, trainer, _ = H
    with pytest.raises(AttributeError, match=r"no `on_init_end`.*lightning_callback"): trainer(gpt(), ActivationStats(), max_steps=1)
    with pytest.raises(AttributeError, match="has no attribute 'colour'"): ActivationStats().colour   # any other name: the usual error
