"""The reference designs' examples, run as they are written (only their import lines point at miniai).

Seed 004 (debuggers): each example debugger is defined here exactly as the document writes it, on top of miniai's
`ForwardDebugger`/`BaseDebugger`; each test runs it and checks the fields and types the document shows, and that
miniai's built-in debugger of the same name returns the same fields with the same types (and the same values where
the document's computation is deterministic). The configuration example runs with the document's classes and with
miniai's. Seed 000: the debug-mode example (collection status of a statistics hook).
"""
import json, math
from collections import OrderedDict
import numpy as np, pytest, torch
from torch import nn
import torch.nn.functional as F
import miniai.debuggers as mdbg
from miniai.datasets import DataLoaders
from miniai.learner import Learner, TrainCB

# ---------------------------------------------------------------------------------------------------------------
# Seed 004, example 1: FeatureMapDebugger (imports adapted)
from typing import Any, Dict
import torch
from miniai.debuggers import ForwardDebugger

class FeatureMapDebugger(ForwardDebugger):
    """Example debugger for extracting feature maps from forward hooks."""

    def process_forward(self, module: torch.nn.Module, input: Any, output: Any) -> Dict[str, Any]:
        """Extract and process feature maps."""
        if isinstance(output, torch.Tensor):
            return {
                'feature_map': output.detach().cpu(),
                'stats': {
                    'mean': float(output.mean()),
                    'std': float(output.std()),
                    'min': float(output.min()),
                    'max': float(output.max()),
                    'shape': list(output.shape)
                },
                'layer_name': self.layer_name
            }
        return {'error': 'Output is not a tensor'}

# Seed 004, example 2: AttentionDebugger (imports adapted)
from typing import Any, Dict
import torch
from miniai.debuggers import ForwardDebugger

class AttentionDebugger(ForwardDebugger):
    """Example debugger for extracting attention maps."""

    def process_forward(self, module: torch.nn.Module, input: Any, output: Any) -> Dict[str, Any]:
        """Extract attention patterns."""
        if isinstance(output, torch.Tensor):
            # Assume output is attention weights
            attention = output.detach().cpu()

            # Get attention statistics
            attention_stats = {
                'entropy': float(-torch.sum(attention * torch.log(attention + 1e-8), dim=-1).mean()),
                'max_attention': float(attention.max()),
                'attention_distribution': attention.mean(dim=0) if len(attention.shape) > 1 else attention
            }

            return {
                'attention_map': attention,
                'attention_stats': attention_stats,
                'layer_name': self.layer_name
            }
        return {'error': 'Output is not a tensor'}

# Seed 004, example 3: ActivationStatsDebugger (imports adapted)
from typing import Any, Dict
import torch
from miniai.debuggers import ForwardDebugger

class ActivationStatsDebugger(ForwardDebugger):
    """Example debugger for collecting activation statistics."""

    def process_forward(self, module: torch.nn.Module, input: Any, output: Any) -> Dict[str, Any]:
        """Collect detailed activation statistics."""
        if isinstance(output, torch.Tensor):
            activation = output.detach().cpu()

            # Compute comprehensive statistics
            stats = {
                'shape': list(activation.shape),
                'mean': float(activation.mean()),
                'std': float(activation.std()),
                'min': float(activation.min()),
                'max': float(activation.max()),
                'l1_norm': float(activation.abs().mean()),
                'l2_norm': float(activation.norm()),
                'sparsity': float((activation == 0).float().mean()),
                'positive_ratio': float((activation > 0).float().mean()),
                'saturation_low': float((activation <= -1).float().mean()),
                'saturation_high': float((activation >= 1).float().mean()),
            }

            # Add channel-wise statistics if applicable
            if len(activation.shape) >= 3:  # Has channel dimension
                channel_means = activation.mean(dim=(0, 2, 3)) if len(activation.shape) == 4 else activation.mean(dim=0)
                stats['channel_means'] = channel_means.tolist()
                stats['channel_stds'] = (activation.std(dim=(0, 2, 3)) if len(activation.shape) == 4 else activation.std(dim=0)).tolist()

            return {
                'layer_name': self.layer_name,
                'module_type': type(module).__name__,
                'activation_stats': stats,
                'sample_values': activation.flatten()[:100].tolist()  # First 100 values for inspection
            }
        return {'error': 'Output is not a tensor'}

# Seed 004, example 4: LayerOutputDebugger (imports adapted)
from typing import Any, Dict
import torch
import torch.nn.functional as F
from miniai.debuggers import ForwardDebugger

class LayerOutputDebugger(ForwardDebugger):
    """Simple debugger that saves raw layer outputs."""

    def __init__(self, layer_name: str, downsample_factor: int = 4):
        super().__init__(layer_name)
        self.downsample_factor = downsample_factor

    def process_forward(self, module: torch.nn.Module, input: Any, output: Any) -> Dict[str, Any]:
        """Save layer output with optional downsampling."""
        if isinstance(output, torch.Tensor):
            output_cpu = output.detach().cpu()

            # Downsample if output is too large
            if len(output_cpu.shape) >= 3 and self.downsample_factor > 1:
                if len(output_cpu.shape) == 4:  # (B, C, H, W)
                    downsampled = F.avg_pool2d(output_cpu, self.downsample_factor)
                elif len(output_cpu.shape) == 3:  # (B, H, W) or (C, H, W)
                    downsampled = F.avg_pool2d(output_cpu.unsqueeze(0), self.downsample_factor).squeeze(0)
                else:
                    downsampled = output_cpu
            else:
                downsampled = output_cpu

            return {
                'layer_name': self.layer_name,
                'original_shape': list(output_cpu.shape),
                'output': downsampled,
                'downsampled': self.downsample_factor > 1,
                'downsample_factor': self.downsample_factor
            }
        return {'error': 'Output is not a tensor'}

# Seed 004, example 5: GradCAMDebugger (imports adapted)
from typing import Any, Dict
import torch
from miniai.debuggers import BaseDebugger

class GradCAMDebugger(BaseDebugger):
    """Example post-forward debugger for computing GradCAM."""

    def __init__(self, target_layer: str, target_class: int = None):
        self.target_layer = target_layer
        self.target_class = target_class

    def __call__(self, datapoint: Dict[str, Dict[str, Any]], model: torch.nn.Module) -> Dict[str, Any]:
        """Compute GradCAM for the target layer."""
        # Extract inputs and outputs
        inputs = datapoint['inputs']
        outputs = datapoint['outputs']

        # Now we have access to the model for gradient computation
        # In practice, you'd use the model to compute gradients and apply GradCAM algorithm
        # For demonstration, we'll create a simple mock GradCAM
        if isinstance(outputs, torch.Tensor):
            # Mock GradCAM as attention over the spatial dimensions
            B, C = outputs.shape[:2]
            if len(outputs.shape) >= 4:  # Has spatial dimensions
                H, W = outputs.shape[2:4]
                gradcam = torch.rand(B, H, W)  # Mock GradCAM
            else:
                gradcam = torch.rand(B, 8, 8)  # Mock spatial GradCAM

            return {
                'gradcam': gradcam.detach().cpu(),
                'target_layer': self.target_layer,
                'target_class': self.target_class,
                'gradcam_stats': {
                    'mean': float(gradcam.mean()),
                    'std': float(gradcam.std()),
                    'shape': list(gradcam.shape)
                }
            }
        else:
            return {'error': 'Model output is not a tensor'}

# Seed 004, configuration example (imports adapted): the classes are the ones defined above
from miniai.debuggers import SequentialDebugger

def seed_config():
    "The document's configuration, as written (wrapped in a function so that each test builds it anew)."
    config = {
        'checkpoint_method': 5,  # Save debug outputs every 5 epochs
        'debugger': {
            'class': SequentialDebugger,
            'args': {
                'page_size_mb': 100,
                'debuggers_config': [
                    {
                        'name': 'backbone_features',
                        'debugger_config': {
                            'class': FeatureMapDebugger,
                            'args': {'layer_name': 'backbone.layer4'}
                        }
                    },
                    {
                        'name': 'attention_analysis',
                        'debugger_config': {
                            'class': AttentionDebugger,
                            'args': {'layer_name': 'head.attention'}
                        }
                    },
                    {
                        'name': 'activation_stats',
                        'debugger_config': {
                            'class': ActivationStatsDebugger,
                            'args': {'layer_name': 'backbone.layer3'}
                        }
                    },
                    {
                        'name': 'raw_outputs',
                        'debugger_config': {
                            'class': LayerOutputDebugger,
                            'args': {
                                'layer_name': 'backbone.layer2',
                                'downsample_factor': 2
                            }
                        }
                    },
                    {
                        'name': 'gradcam_analysis',
                        'debugger_config': {
                            'class': GradCAMDebugger,
                            'args': {
                                'target_layer': 'backbone.layer4',
                                'target_class': None
                            }
                        }
                    }
                ]
            }
        }
    }
    return config

# ---------------------------------------------------------------------------------------------------------------
# A model with the layer names of the document's config

class TokenAttention(nn.Module):
    def __init__(self, d): super().__init__(); self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)
    def forward(self, x): return (self.q(x) @ self.k(x).transpose(1, 2) / math.sqrt(x.shape[-1])).softmax(-1)

class Head(nn.Module):
    def __init__(self, d, n_classes): super().__init__(); self.attention, self.out = TokenAttention(d), nn.Linear(d, n_classes)
    def forward(self, feats):
        tokens = feats.flatten(2).transpose(1, 2)
        return self.out((self.attention(tokens) @ tokens).mean(1))

def block(ni, nf, stride): return nn.Sequential(nn.Conv2d(ni, nf, 3, stride, 1), nn.ReLU())

def make_net():
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(
        backbone=nn.Sequential(OrderedDict(layer1=block(1, 4, 1), layer2=block(4, 8, 2), layer3=block(8, 8, 1), layer4=block(8, 16, 2))),
        head=Head(16, 3)))

class Const(nn.Module):
    def __init__(self, value): super().__init__(); self.value = value
    def forward(self, x): return self.value

def const_model(value): return nn.Sequential(OrderedDict(out=Const(value)))

@pytest.fixture
def net(): return make_net()
@pytest.fixture
def xb():
    torch.manual_seed(1)
    return torch.randn(4, 1, 14, 14)

def no_constants(name): raise ValueError(f'not strict JSON: {name}')

def types_of(o):
    "The type names of `o`'s values, recursively into dicts (numpy arrays count as tensors)."
    if isinstance(o, dict): return {k: types_of(v) for k, v in o.items()}
    return 'Tensor' if isinstance(o, (torch.Tensor, np.ndarray)) else type(o).__name__

def assert_same_fields(seed_res, ours):
    "miniai's result has every field of the document's, with the same type."
    seed_types, our_types = types_of(seed_res), types_of(ours)
    def check(a, b, path):
        for k, t in a.items():
            assert k in b, f'{path}{k} is missing from miniai\'s result'
            if isinstance(t, dict): check(t, b[k], f'{path}{k}.')
            else: assert b[k] == t, f'{path}{k}: the document gives {t}, miniai {b[k]}'
    check(seed_types, our_types, '')

def nested_close(a, b, **kw):
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), **kw)

# ---------------------------------------------------------------------------------------------------------------

def test_feature_map_example(net, xb):
    res = FeatureMapDebugger('backbone.layer4')({'inputs': xb, 'outputs': None}, net)
    assert isinstance(res['feature_map'], torch.Tensor) and res['feature_map'].device.type == 'cpu'
    assert all(type(res['stats'][k]) is float for k in ('mean', 'std', 'min', 'max'))
    assert res['stats']['shape'] == [4, 16, 4, 4] and res['layer_name'] == 'backbone.layer4'
    ours = mdbg.FeatureMapDebugger('backbone.layer4')({'inputs': xb, 'outputs': None}, net)
    assert_same_fields(res, ours)
    for k in ('mean', 'std', 'min', 'max'): assert ours['stats'][k] == pytest.approx(res['stats'][k], rel=1e-5, abs=1e-7)
    assert torch.equal(ours['feature_map'], res['feature_map'])
    json.dumps(ours['stats'], allow_nan=False)
    assert FeatureMapDebugger('out')({'inputs': xb}, const_model(None)) == {'error': 'Output is not a tensor'}
    assert 'not a tensor' in mdbg.FeatureMapDebugger('out')({'inputs': xb}, const_model(None))['error']

def test_attention_example(net, xb):
    res = AttentionDebugger('head.attention')({'inputs': xb, 'outputs': None}, net)
    st = res['attention_stats']
    assert type(st['entropy']) is float and type(st['max_attention']) is float
    assert isinstance(st['attention_distribution'], torch.Tensor) and st['attention_distribution'].shape == (16, 16)
    assert isinstance(res['attention_map'], torch.Tensor) and res['attention_map'].shape == (4, 16, 16)
    ours = mdbg.AttentionDebugger('head.attention')({'inputs': xb, 'outputs': None}, net)
    assert_same_fields(res, ours)
    assert ours['attention_stats']['entropy'] == pytest.approx(st['entropy'], rel=1e-5)
    assert ours['attention_stats']['max_attention'] == pytest.approx(st['max_attention'], rel=1e-6)
    torch.testing.assert_close(ours['attention_stats']['attention_distribution'], st['attention_distribution'])

@pytest.mark.parametrize('shape', [(4, 8, 7, 7), (6, 5, 7), (6, 5), (10,)], ids=['4d', '3d', '2d', '1d'])
def test_activation_stats_example(shape):
    torch.manual_seed(2)
    out = torch.randn(shape) * 1.5
    model = const_model(out)
    res = ActivationStatsDebugger('out')({'inputs': None, 'outputs': None}, model)
    ours = mdbg.ActivationStatsDebugger('out')({'inputs': None, 'outputs': None}, model)
    st, ost = res['activation_stats'], ours['activation_stats']
    assert st['shape'] == list(shape) and ost['shape'] == list(shape)
    assert_same_fields(res, ours)
    for k in ('mean', 'std', 'min', 'max', 'l1_norm', 'l2_norm', 'sparsity', 'positive_ratio', 'saturation_low', 'saturation_high'):
        assert type(st[k]) is float and type(ost[k]) is float
        assert ost[k] == pytest.approx(st[k], rel=1e-5, abs=1e-6), k
    assert ('channel_means' in ost) == ('channel_means' in st) == (len(shape) >= 3)
    if len(shape) >= 3:
        assert isinstance(ost['channel_means'], list) and isinstance(ost['channel_stds'], list)
        nested_close(ost['channel_means'], st['channel_means'], rtol=1e-5, atol=1e-6)
        nested_close(ost['channel_stds'], st['channel_stds'], rtol=1e-5, atol=1e-6)
        assert np.asarray(ost['channel_means']).shape == ((shape[1],) if len(shape) == 4 else shape[1:])
    assert ours['sample_values'] == res['sample_values'] and isinstance(ours['sample_values'], list)
    assert ours['module_type'] == res['module_type'] == 'Const'
    json.dumps(ours, allow_nan=False)                                       # plain Python all the way down

@pytest.mark.parametrize('shape,factor,pooled', [((4, 8, 7, 7), 2, (4, 8, 3, 3)), ((8, 7, 7), 2, (8, 3, 3)), ((4, 8, 9, 9), 4, (4, 8, 2, 2)),
                                                  ((4, 8, 7, 7), 1, (4, 8, 7, 7)), ((6, 5), 4, (6, 5))])
def test_layer_output_example(shape, factor, pooled):
    torch.manual_seed(3)
    model = const_model(torch.randn(shape))
    res = LayerOutputDebugger('out', downsample_factor=factor)({'inputs': None}, model)
    ours = mdbg.LayerOutputDebugger('out', downsample_factor=factor)({'inputs': None}, model)
    assert_same_fields(res, ours)
    assert tuple(res['output'].shape) == tuple(ours['output'].shape) == pooled
    torch.testing.assert_close(ours['output'], res['output'])
    assert ours['original_shape'] == res['original_shape'] == list(shape)
    assert ours['downsampled'] is res['downsampled'] is (factor > 1)
    assert ours['downsample_factor'] == factor

def test_layer_output_example_on_the_config_layer(net, xb):
    "The config's raw_outputs: backbone.layer2 is 7x7, pooled by 2 it is 3x3."
    res = LayerOutputDebugger('backbone.layer2', downsample_factor=2)({'inputs': xb}, net)
    ours = mdbg.LayerOutputDebugger('backbone.layer2', downsample_factor=2)({'inputs': xb}, net)
    assert res['output'].shape == ours['output'].shape == (4, 8, 3, 3)
    torch.testing.assert_close(ours['output'], res['output'])

def test_gradcam_example(net, xb):
    logits = net(xb).detach()
    res = GradCAMDebugger('backbone.layer4')({'inputs': xb, 'outputs': logits}, net)
    assert isinstance(res['gradcam'], torch.Tensor) and res['gradcam'].shape == (4, 8, 8)    # the document's mock for 2-d outputs
    assert res['target_layer'] == 'backbone.layer4' and res['target_class'] is None
    assert type(res['gradcam_stats']['mean']) is float and type(res['gradcam_stats']['std']) is float
    assert res['gradcam_stats']['shape'] == [4, 8, 8]
    assert GradCAMDebugger('x')({'inputs': xb, 'outputs': None}, net) == {'error': 'Model output is not a tensor'}
    ours = mdbg.GradCAMDebugger('backbone.layer4')({'inputs': xb, 'outputs': logits}, net)
    assert_same_fields(res, ours)
    assert ours['gradcam'].shape == (4, 14, 14) and ours['gradcam_stats']['shape'] == [4, 14, 14]   # a real heatmap, at the input's size
    json.dumps(ours['gradcam_stats'], allow_nan=False)

def check_config_results(results, bs=4):
    assert list(results) == ['backbone_features', 'attention_analysis', 'activation_stats', 'raw_outputs', 'gradcam_analysis']
    assert results['backbone_features']['stats']['shape'] == [bs, 16, 4, 4]
    assert type(results['backbone_features']['stats']['mean']) is float
    assert type(results['attention_analysis']['attention_stats']['entropy']) is float
    assert isinstance(results['activation_stats']['activation_stats']['channel_means'], list)
    assert len(results['activation_stats']['activation_stats']['channel_means']) == 8
    assert results['raw_outputs']['output'].shape == (bs, 8, 3, 3) and results['raw_outputs']['downsampled'] is True
    assert isinstance(results['gradcam_analysis']['gradcam'], torch.Tensor)
    assert type(results['gradcam_analysis']['gradcam_stats']['mean']) is float

def check_pages(path):
    index_text = (path/'index.json').read_text()
    index = json.loads(index_text, parse_constant=no_constants)
    for page in index['pages']: json.loads((path/page['json']).read_text(), parse_constant=no_constants)
    return mdbg.load_pages(path)

def builtin_config():
    "The document's configuration with miniai's classes in place of the examples'."
    config = seed_config()
    for entry in config['debugger']['args']['debuggers_config']:
        entry['debugger_config']['class'] = getattr(mdbg, entry['debugger_config']['class'].__name__)
    return config

@pytest.mark.parametrize('make_config', [seed_config, builtin_config], ids=['document_classes', 'miniai_classes'])
def test_config_example(make_config, net, xb, tmp_path):
    config = make_config()
    sd = mdbg.build_debugger(config['debugger'])
    assert isinstance(sd, SequentialDebugger) and sd.page_size_mb == 100
    sd.path = tmp_path/'direct'
    with sd: results = sd({'inputs': xb, 'outputs': net(xb).detach()}, net, epoch=0)
    check_config_results(results)
    records = check_pages(tmp_path/'direct')
    assert len(records) == 1 and records[0]['epoch'] == 0
    check_config_results(records[0]['results'])
    assert sum(len(m._forward_hooks) for m in net.modules()) == 0

@pytest.mark.filterwarnings('ignore:Converting a tensor with requires_grad')   # the document's float(output.mean()) in training
@pytest.mark.parametrize('make_config', [seed_config, builtin_config], ids=['document_classes', 'miniai_classes'])
def test_config_example_in_training(make_config, net, tmp_path):
    "`checkpoint_method: 5`: a fit of 5 epochs debugs the first batch of epoch 4 (the fifth)."
    torch.manual_seed(4)
    x, y = torch.randn(16, 1, 14, 14), torch.randint(0, 3, (16,))
    ds = list(zip(x, y))
    dls = DataLoaders(torch.utils.data.DataLoader(ds, 8), torch.utils.data.DataLoader(ds, 8))
    cb = mdbg.DebugCB.from_config(make_config())
    cb.debugger.path = tmp_path/'fit'
    Learner(net, dls, F.cross_entropy, lr=0.01, cbs=[TrainCB(), cb]).fit(5, valid=False)
    records = check_pages(tmp_path/'fit')
    assert [(r['epoch'], r['iter'], r['train']) for r in records] == [(4, 0, True)]
    check_config_results(records[0]['results'], bs=8)
    assert sum(len(m._forward_hooks) for m in net.modules()) == 0

# ---------------------------------------------------------------------------------------------------------------
# Seed 000, "Debug Mode" (imports adapted), then the same after a forward pass

def test_statistics_debug_mode_example(capsys):
    from miniai.statistics import ActivationStatisticsHook, StatisticsConfig
    # Enable debug information
    config = StatisticsConfig(collect_mean=True)
    stats_hook = ActivationStatisticsHook(config)

    # Check collection status
    print(f"Total modules with statistics: {len(stats_hook.get_all_statistics())}")
    print(f"Hook call count: {stats_hook.call_count}")

    # Verify specific module
    stats = stats_hook.get_statistics("conv1")
    if stats is None:
        print("No statistics collected for conv1")
    else:
        print(f"Conv1 samples: {stats.total_samples}")
    assert capsys.readouterr().out.splitlines() == ['Total modules with statistics: 0', 'Hook call count: 0', 'No statistics collected for conv1']

    model = nn.Sequential(OrderedDict(conv1=nn.Conv2d(1, 2, 3)))
    model.conv1._hook_name = 'conv1'
    handle = model.conv1.register_forward_hook(stats_hook)
    with torch.no_grad():
        for _ in range(3): model(torch.randn(2, 1, 6, 6))
    handle.remove()
    stats = stats_hook.get_statistics("conv1")
    assert type(stats_hook.call_count) is int and stats_hook.call_count == 3
    assert type(stats.total_samples) is int and stats.total_samples == 6
    assert len(stats_hook.get_all_statistics()) == 1
