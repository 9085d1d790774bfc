"""The examples of the APIs miniai implements (the course's, the statistics hook's, the saving hook's, the debuggers'), run as they are written (only their import lines point at miniai).

The debuggers' document: each example debugger is defined here exactly as the document writes it, on top of miniai's
`ForwardDebugger`/`BaseDebugger`; each test runs it and checks the fields and types the document shows, and that
miniai's built-in debugger of the same name returns the same fields with the same types (and the same values where
the document's computation is deterministic). The configuration example runs with the document's classes and with
miniai's. The statistics document: every example, and the debug-mode one (a statistics hook's collection status).
The saving hook's document: registering, the files it writes, and the checker that compares two runs.
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
# The debuggers' document, example 1: FeatureMapDebugger (imports adapted)
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

# The debuggers' document, example 2: AttentionDebugger (imports adapted)
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

# The debuggers' document, example 3: ActivationStatsDebugger (imports adapted)
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

# The debuggers' document, example 4: LayerOutputDebugger (imports adapted)
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

# The debuggers' document, example 5: GradCAMDebugger (imports adapted)
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

# The debuggers' document, configuration example (imports adapted): the classes are the ones defined above
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
# The statistics document, "Debug Mode" (imports adapted), then the same after a forward pass

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

# ---------------------------------------------------------------------------------------------------------------
# The statistics document: every example, as written (only the imports point at miniai). `YourModel` is the smallest model the
# document implies: it names `model.conv1` and the layers "conv1", "conv2", "fc1"; its loaders yield image batches.
import warnings
from miniai.statistics import ActivationStatisticsHook, StatisticsConfig, StatisticsCollector

class YourModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 4, 3, 2, 1), nn.Conv2d(4, 8, 3, 2, 1)
        self.bn = nn.BatchNorm2d(8)
        self.fc1, self.fc2 = nn.Linear(8*7*7, 16), nn.Linear(16, 10)
    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.bn(self.conv2(x)))
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))

def image_loader(n=48, bs=16, seed=0):
    "Batches of 28x28 images, as plain tensors (the document's `for batch in dataloader: model(batch)`)."
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.DataLoader(torch.randn(n, 1, 28, 28, generator=g), batch_size=bs)

def labelled_loader(n=48, bs=16):
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.DataLoader(list(zip(torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g))), batch_size=bs)

def strict_json(obj): return json.loads(json.dumps(obj, allow_nan=False), parse_constant=no_constants)

def test_statistics_config_fields():
    "The documented dataclass: fields, defaults and types; `update_frequency` is the field miniai calls `every`, read and set by either name."
    from dataclasses import fields
    cfg = StatisticsConfig()
    expected = dict(collect_mean=True, collect_std=True, collect_min_max=True, collect_percentiles=[95, 99], collect_histogram=False,
                    histogram_bins=100, collect_sparsity=False, update_frequency=1, max_samples=1000, max_memory_mb=None)
    assert {k: getattr(cfg, k) for k in expected} == expected
    assert [{'update_frequency': 'every'}.get(k, k) for k in expected] == [f.name for f in fields(StatisticsConfig)][:len(expected)]
    assert StatisticsConfig(update_frequency=3).every == 3 and StatisticsConfig(every=3).update_frequency == 3
    assert StatisticsConfig().collect_percentiles is not cfg.collect_percentiles     # no shared mutable default

def test_basic_usage_example(capsys):
    dataloader = image_loader()
    import torch
    import torch.nn as nn
    from miniai.statistics import ActivationStatisticsHook, StatisticsConfig

    # Create your model
    model = YourModel()

    # Configure statistics collection
    config = StatisticsConfig(
        collect_mean=True,
        collect_std=True,
        collect_min_max=True,
        collect_percentiles=[95, 99]
    )

    # Create statistics hook
    stats_hook = ActivationStatisticsHook(config)

    # Register hooks on specific layers
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            module._hook_name = name  # Set name for identification
            hook_handle = module.register_forward_hook(stats_hook)
            hooks.append(hook_handle)

    # Run your model
    model.eval()
    with torch.no_grad():
        for batch in dataloader:
            output = model(batch)

    # Get statistics
    all_stats = stats_hook.get_all_statistics()
    for module_name, stats in all_stats.items():
        print(f"{module_name}: mean={stats.output_stats.mean:.4f}, std={stats.output_stats.std:.4f}")

    # Export statistics
    stats_data = stats_hook.export_statistics(format="json")

    # Clean up
    for hook in hooks:
        hook.remove()

    lines = capsys.readouterr().out.splitlines()
    assert [l.split(':')[0] for l in lines] == ['conv1', 'conv2', 'fc1', 'fc2']
    assert sum(len(m._forward_hooks) for m in model.modules()) == 0
    for name, st in all_stats.items():
        o = st.output_stats
        assert all(type(getattr(o, k)) is float for k in ('mean', 'std', 'min', 'max'))
        assert set(o.percentiles) == {95, 99} and all(type(v) is float for v in o.percentiles.values())
        assert type(st.total_samples) is int and st.total_samples == 48
    # the documented JSON structure
    assert strict_json(stats_data) == stats_data and list(stats_data) == ['conv1', 'conv2', 'fc1', 'fc2']
    for entry in stats_data.values():
        assert type(entry['total_samples']) is int
        datetime_ok = __import__('datetime').datetime.fromisoformat(entry['last_updated'])
        assert datetime_ok.microsecond == 0                                   # "2024-01-01T12:00:00"
        for kind in ('input_stats', 'output_stats'):
            s = entry[kind]
            assert all(type(s[k]) is float for k in ('mean', 'std', 'min', 'max'))
            assert set(s['percentiles']) == {'95', '99'} and all(type(v) is float for v in s['percentiles'].values())
            assert 'sparsity_ratio' in s                                       # null: not collected (collect_sparsity=False)

def test_quantization_calibration_example():
    model, calibration_loader = YourModel(), image_loader(seed=2)
    # Configure for quantization calibration
    config = StatisticsConfig(
        collect_min_max=True,      # Essential for quantization
        collect_percentiles=[99.9], # For outlier handling
        collect_mean=False,        # Not needed for quantization
        collect_std=False,         # Not needed for quantization
        max_samples=5000          # Limit memory usage
    )

    stats_hook = ActivationStatisticsHook(config)

    # Register on all layers
    for name, module in model.named_modules():
        if len(list(module.children())) == 0:  # Leaf modules only
            module._hook_name = name
            module.register_forward_hook(stats_hook)

    # Run calibration
    model.eval()
    with torch.no_grad():
        for batch in calibration_loader:
            model(batch)

    # Export quantization data
    quant_data = stats_hook.export_statistics(format="quantization")

    assert list(quant_data) == ['conv1', 'conv2', 'bn', 'fc1', 'fc2'] and strict_json(quant_data) == quant_data
    for entry in quant_data.values():
        assert type(entry['min']) is float and type(entry['max']) is float and entry['min'] <= entry['max']
        assert list(entry['percentiles']) == ['99.9'] and type(entry['percentiles']['99.9']) is float
        assert entry['min'] <= entry['percentiles']['99.9'] <= entry['max']
    st = stats_hook.get_statistics('fc2').output_stats
    assert st.mean is None and st.std is None                                  # not collected, as configured

def test_training_monitoring_example(capsys):
    model, train_loader, num_epochs = YourModel(), labelled_loader(), 2
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # Configure for training monitoring
    config = StatisticsConfig(
        collect_mean=True,
        collect_std=True,
        collect_sparsity=True,
        update_frequency=10,  # Update every 10 forward passes
        max_samples=1000
    )

    stats_hook = ActivationStatisticsHook(config)

    # Register on key layers
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            module._hook_name = name
            module.register_forward_hook(stats_hook)

    # Training loop with monitoring
    for epoch in range(num_epochs):
        for batch_idx, (data, target) in enumerate(train_loader):
            # ... training code ... (here: one SGD step)
            loss = F.cross_entropy(model(data), target)
            opt.zero_grad(); loss.backward(); opt.step()

            # Check for issues periodically
            if batch_idx % 100 == 0:
                all_stats = stats_hook.get_all_statistics()
                for module_name, stats in all_stats.items():
                    # Check for dead neurons
                    if stats.output_stats.sparsity_ratio > 0.9:
                        print(f"Warning: {module_name} has high sparsity")

                    # Check for vanishing activations
                    if stats.output_stats.std < 0.01:
                        print(f"Warning: {module_name} has low variance")

    assert capsys.readouterr().out == ''                                       # a healthy model: no warnings
    for st in stats_hook.get_all_statistics().values():
        assert type(st.output_stats.sparsity_ratio) is float and 0 <= st.output_stats.sparsity_ratio <= 1
        assert type(st.output_stats.std) is float
        assert st.calls == 6 and st.n_updates == 1                            # calls 1 (and 11, 21...) are recorded

def test_model_analysis_example(capsys):
    torch.manual_seed(3)
    model, analysis_loader = YourModel(), image_loader(seed=3)
    # Configure for comprehensive analysis
    config = StatisticsConfig(
        collect_mean=True,
        collect_std=True,
        collect_min_max=True,
        collect_percentiles=[1, 5, 25, 50, 75, 95, 99],
        collect_sparsity=True,
        collect_histogram=True,
        histogram_bins=50
    )

    stats_hook = ActivationStatisticsHook(config)

    # Register on all layers
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear, nn.BatchNorm2d)):
            module._hook_name = name
            module.register_forward_hook(stats_hook)

    # Run analysis
    model.eval()
    with torch.no_grad():
        for batch in analysis_loader:
            model(batch)

    # Comprehensive analysis
    all_stats = stats_hook.get_all_statistics()

    # Find problematic layers
    for module_name, stats in all_stats.items():
        output_stats = stats.output_stats

        # Check activation range
        if output_stats.max - output_stats.min < 0.1:
            print(f"{module_name}: Very narrow activation range")

        # Check for saturation
        if output_stats.percentiles.get(99, 0) == output_stats.max:
            print(f"{module_name}: Possible activation saturation")

        # Check distribution
        if abs(output_stats.mean) > 2 * output_stats.std:
            print(f"{module_name}: Skewed activation distribution")

    capsys.readouterr()
    assert list(all_stats) == ['conv1', 'conv2', 'bn', 'fc1', 'fc2']
    for st in all_stats.values():
        o = st.output_stats
        assert list(o.percentiles) == [1, 5, 25, 50, 75, 95, 99] and all(type(v) is float for v in o.percentiles.values())
        assert o.min <= o.percentiles[1] <= o.percentiles[50] <= o.percentiles[99] <= o.max
        assert type(o.sparsity_ratio) is float
        h = o.histogram
        assert len(h['counts']) == 50 and len(h['edges']) == 51 and sum(h['counts']) == o.count and h['estimated'] is True
    exported = stats_hook.export_statistics(format='json')
    assert strict_json(exported) == exported

def test_custom_collector_example():
    model, dataloader = YourModel(), image_loader(seed=4)
    config = StatisticsConfig()
    from miniai.statistics import StatisticsCollector

    # Create custom collector
    collector = StatisticsCollector(config)

    # Manual statistics collection during custom forward pass
    def custom_forward(model, x):
        # Layer 1
        conv1_out = model.conv1(x)
        collector.update_statistics("conv1", x, conv1_out)

        # Layer 2
        relu_out = torch.relu(conv1_out)
        collector.update_statistics("relu", conv1_out, relu_out)

        # Continue for other layers... (here: the rest of the model, not recorded)
        final_output = model.fc2(torch.relu(model.fc1(torch.relu(model.bn(model.conv2(relu_out))).flatten(1))))
        return final_output

    # Use custom forward pass
    for batch in dataloader:
        output = custom_forward(model, batch)

    # Get statistics
    stats = collector.get_all_statistics()

    assert list(stats) == ['conv1', 'relu'] and output.shape == (16, 10)
    assert stats['relu'].input_stats == stats['conv1'].output_stats             # the same tensor, the same statistics
    assert stats['relu'].output_stats.min == 0.0 and stats['conv1'].total_samples == 48

def test_memory_efficient_example():
    model = YourModel()
    # Configure for large models with memory constraints
    config = StatisticsConfig(
        collect_mean=True,
        collect_std=True,
        collect_min_max=True,
        collect_percentiles=[95],  # Fewer percentiles
        max_samples=100,          # Very limited samples
        update_frequency=5,       # Less frequent updates
        max_memory_mb=50         # Memory limit
    )

    stats_hook = ActivationStatisticsHook(config)

    # Register selectively on important layers only
    important_layers = ["conv1", "conv2", "fc1"]
    for name, module in model.named_modules():
        if name in important_layers:
            module._hook_name = name
            module.register_forward_hook(stats_hook)

    with torch.no_grad():
        for batch in image_loader(n=96, bs=8): model(batch)
    all_stats = stats_hook.get_all_statistics()
    assert list(all_stats) == important_layers
    assert stats_hook.memory_log == []                                         # 50 MB: nothing degraded
    assert all((st.calls, st.n_updates, st.total_samples) == (12, 3, 24) for st in all_stats.values())   # calls 1, 6, 11
    assert stats_hook.memory_bytes <= 50 * 2**20 and stats_hook.memory_log == []
    for st in all_stats.values():
        assert st.calls == 12 and st.n_updates == 3 and st.total_samples == 24
        assert type(st.output_stats.percentiles[95]) is float

@pytest.mark.parametrize('percentile', [99.9, 95])
def test_quantization_export_structure(percentile):
    "The documented structure: {module: {min, max, percentiles: {'99.9': ...}}}, keys as the document writes them."
    model = YourModel()
    hook = ActivationStatisticsHook(StatisticsConfig(collect_percentiles=[percentile]))
    model.fc2._hook_name = 'fc2'
    handle = model.fc2.register_forward_hook(hook)
    with torch.no_grad(): model(torch.randn(8, 1, 28, 28))
    handle.remove()
    entry = hook.export_statistics(format='quantization')['fc2']
    assert {'min', 'max', 'percentiles'} <= set(entry) and list(entry['percentiles']) == [f'{percentile:g}']

# ---------------------------------------------------------------------------------------------------------------
# The saving hook's document: the saving hook and the checker. `LLama13B` becomes the smallest model with its layer classes
# (embeddings, LayerNorm, Linear); `Trainer(model).train()` becomes one epoch of miniai's TrainLearner.
import csv, inspect, os, re, subprocess, sys
import miniai.dumps as mdumps
import miniai.compare as mcompare
from miniai.learner import TrainLearner
from miniai.datasets import DataLoaders as _DataLoaders

class LLama13B(nn.Module):
    "Not 13B: embeddings, two pre-norm MLP blocks (LayerNorm, Linear, GELU, Linear), a final LayerNorm and the output Linear."
    def __init__(self, vocab=32, dim=16, n_layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, 2*dim), nn.GELU(), nn.Linear(2*dim, dim))
                                    for _ in range(n_layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)
    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks: x = x + block(x)
        return self.head(self.norm(x))

def _token_dls(n=32, seq=12, vocab=32, bs=8):
    g = torch.Generator().manual_seed(0)
    seqs = torch.randint(0, vocab, (n, seq + 1), generator=g)
    ds = list(zip(seqs[:, :-1], seqs[:, 1:]))
    return _DataLoaders(torch.utils.data.DataLoader(ds, bs), torch.utils.data.DataLoader(ds, bs))

def _lm_loss(logits, targets): return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

class Trainer:
    "The document's `Trainer(model)` / `trainer.train()`, built from miniai's TrainLearner (miniai's Learner has no `train()`)."
    lr = 0.1
    def __init__(self, model): self.learn = TrainLearner(model, _token_dls(), _lm_loss, lr=self.lr)
    def train(self): self.learn.fit(1, valid=False)

DOC_CLASSES = ['ColumnSequenceParallelLinear', 'RowSequenceParallelLinear', 'LayerNorm']
README_COLUMNS = ['tensor_name', 'cosine similarity', 'meanA', 'meanB', 'meanA - meanB', 'stdA', 'stdB', 'stdA - stdB',
                  'varA', 'varB', 'varA - varB']

def run_readme_example(lr=0.1):
    "Step 1 of the document, as written (run in the current folder: path='./tmp_tensors')."
    from miniai.dumps import register_saving_hook
    torch.manual_seed(0)
    Trainer.lr = lr

    model = LLama13B()
    model = register_saving_hook(
      model,
      path='./tmp_tensors',
      target_class_names=['ColumnSequenceParallelLinear', 'RowSequenceParallelLinear', 'LayerNorm'],
      max_saved_tensors=100,
      max_saved_grads=200
    )
    trainer = Trainer(model)
    trainer.train()
    return model

def test_register_hook_signature():
    "The document's `register_hook(model, path='./tmp_tensors', target_class_names=None, max_saved_tensors=50, max_saved_grads=100)`: the same positions and defaults, the third argument under miniai's name `layers`."
    from miniai.dumps import register_hook, register_saving_hook
    for fn in (register_hook, register_saving_hook):
        params = inspect.signature(fn).parameters
        assert [(k, params[k].default) for k in list(params)[:5]] == [
            ('model', inspect.Parameter.empty), ('path', './tmp_tensors'), ('layers', None),
            ('max_saved_tensors', 50), ('max_saved_grads', 100)]

@pytest.mark.parametrize('register', ['register_hook', 'register_saving_hook'])
def test_readme_step1_example(register, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mdumps, 'register_saving_hook', getattr(mdumps, register))
    with pytest.warns(mdumps.TargetClassWarning, match=r"\['ColumnSequenceParallelLinear', 'RowSequenceParallelLinear'\] match no module") as rec:
        model = run_readme_example()
    assert 'LayerNorm, Linear' in str(rec[0].message)                         # it names the classes the model has
    hook = model.saving_hook
    assert hook.target_class_names == ['LayerNorm'] and not hook.closed
    hook.remove()
    # the documented layout: tmp_tensors/{tensors,grads}/rank_0/tensor_idx_XX_layer_class_XX_layer_name_XX_micro_step_XX.npy
    pattern = r'tensor_idx_(\d+)_layer_class_LayerNorm_layer_name_(.+)_micro_step_(\d+)\.npy'
    for kind, n in [('tensors', 4*3), ('grads', 4*6)]:
        files = sorted((tmp_path/'tmp_tensors'/kind/'rank_0').glob('*.npy'))
        assert len(files) == n and all(re.fullmatch(pattern, f.name) for f in files)
        assert sorted(int(re.fullmatch(pattern, f.name).group(1)) for f in files) == list(range(n))
        assert {int(re.fullmatch(pattern, f.name).group(3)) for f in files} == {0, 1, 2, 3}
        for f in files: assert np.load(f, allow_pickle=False).dtype == np.float32
    assert sorted(p.name for p in (tmp_path/'tmp_tensors').iterdir()) == ['grads', 'tensors']

def test_readme_limits(tmp_path):
    "max_saved_tensors / max_saved_grads: the numbers of files; negative saves all."
    from miniai.dumps import register_hook
    for (mt, mg), expected in [((5, 7), (5, 7)), ((-1, -1), (12, 24)), ((0, 0), (0, 0))]:
        path = tmp_path/f'run_{mt}_{mg}'
        model = register_hook(LLama13B(), path=path, target_class_names='LayerNorm', max_saved_tensors=mt, max_saved_grads=mg)
        Trainer(model).train(); model.saving_hook.remove()
        assert (len(list((path/'tensors'/'rank_0').glob('*.npy'))), len(list((path/'grads'/'rank_0').glob('*.npy')))) == expected

def test_target_class_names_none_default(tmp_path):
    "None: miniai's default layers, the leaf modules that hold parameters."
    from miniai.dumps import register_hook
    model = register_hook(LLama13B(), path=tmp_path)
    assert model.saving_hook.layers is None and [h.name for h in model.saving_hook.hooks] == ['embed', 'blocks.0.0', 'blocks.0.1', 'blocks.0.3', 'blocks.1.0', 'blocks.1.1', 'blocks.1.3', 'norm', 'head']
    with torch.no_grad(): model(torch.zeros(1, 4, dtype=torch.long))
    model.saving_hook.remove()
    assert len(list((tmp_path/'tensors'/'rank_0').glob('*.npy'))) == 1 + 2*3 + 1 + 1   # embed, 2 blocks x (norm + 2 linears), norm, head
    with pytest.raises(ValueError, match='has none'): register_hook(nn.Sequential(nn.ReLU()), path=tmp_path)

def test_target_class_names_matching_nothing(tmp_path):
    from miniai.dumps import register_hook
    with pytest.raises(ValueError) as e:
        register_hook(LLama13B(), path=tmp_path, target_class_names=['ColumnSequenceParallelLinear', 'RowSequenceParallelLinear'])
    msg = str(e.value)
    assert "['ColumnSequenceParallelLinear', 'RowSequenceParallelLinear'] match no module" in msg
    assert 'Embedding, GELU, LayerNorm, Linear, ModuleList, Sequential, LLama13B' in msg or 'Embedding, GELU, LLama13B, LayerNorm' in msg
    assert not (tmp_path/'tensors').exists()                                  # nothing created
    hooked = register_hook(LLama13B(), path=tmp_path/'classes', target_class_names=[nn.LayerNorm]).saving_hook   # classes themselves: the same layers
    assert [h.name for h in hooked.hooks] == ['blocks.0.0', 'blocks.1.0', 'norm']
    hooked.remove()

def test_target_class_names_present_classes(tmp_path):
    "A model that has the tensor-parallel classes (stand-ins of that name) saves all three, without a warning."
    class ColumnSequenceParallelLinear(nn.Linear): pass
    class RowSequenceParallelLinear(nn.Linear): pass
    model = nn.Sequential(nn.LayerNorm(4), ColumnSequenceParallelLinear(4, 8), RowSequenceParallelLinear(8, 4))
    from miniai.dumps import register_saving_hook
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        model = register_saving_hook(model, path=tmp_path, target_class_names=DOC_CLASSES, max_saved_tensors=100, max_saved_grads=200)
    model(torch.randn(2, 4)).sum().backward()
    model.saving_hook.remove()
    names = sorted(p.name for p in (tmp_path/'tensors'/'rank_0').glob('*.npy'))
    assert [re.search(r'layer_class_(\w+?)_layer_name', n).group(1) for n in names] == [
        'LayerNorm', 'ColumnSequenceParallelLinear', 'RowSequenceParallelLinear']
    assert len(list((tmp_path/'grads'/'rank_0').glob('*.npy'))) == 6

def _checker(cwd, *args):
    "Step 2 as written, with miniai's module in place of hook_result_checker.py."
    return subprocess.run([sys.executable, '-m', 'miniai.compare', *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, 'PYTHONPATH': os.pathsep.join(sys.path)})

def test_readme_step2_and_3_example(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.warns(mdumps.TargetClassWarning): run_readme_example(lr=0.1).saving_hook.remove()
    os.rename('tmp_tensors', 'tmp_tensors_0')
    with pytest.warns(mdumps.TargetClassWarning): run_readme_example(lr=0.2).saving_hook.remove()
    proc = _checker(tmp_path, '--pathA', 'tmp_tensors', '--pathB', 'tmp_tensors_0')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '100.00% [36/36' in proc.stdout                                    # "progress bars will be shown"
    # results in pathA/{tensors,grads}/compare_rst/rank_0_rst.csv, the document's 11 columns first
    for kind, n in [('tensors', 12), ('grads', 24)]:
        out = tmp_path/'tmp_tensors'/kind/'compare_rst'
        assert sorted(p.name for p in out.iterdir()) == ['rank_0_rst.csv', 'rank_0_uncompared.csv']
        with open(out/'rank_0_rst.csv', newline='') as f: rows = list(csv.reader(f))
        assert rows[0][:11] == README_COLUMNS and len(rows) == n + 1
        for row in rows[1:]:
            assert re.fullmatch(r'tensor_idx_\d+_layer_class_LayerNorm_.+\.npy', row[0])
            for cell in row[1:len(rows[0])]:
                if cell not in ('float32',): float(cell)                     # every statistic is a number
        parsed = mcompare.read_csv(out/'rank_0_rst.csv')
        assert all(type(r[c]) is float for r in parsed for c in README_COLUMNS[1:])
        for r in parsed:
            assert r['varA'] == pytest.approx(r['stdA']**2, rel=1e-9) and r['meanA - meanB'] == pytest.approx(r['meanA'] - r['meanB'], abs=1e-12)
        step0 = [r for r in parsed if r['tensor_name'].endswith('micro_step_0.npy')]
        assert step0 and all(r['cosine similarity'] == 1.0 and r['meanA - meanB'] == 0.0 for r in step0)   # same weights, same data
        assert mcompare.read_csv(out/'rank_0_uncompared.csv') == []

def test_readme_checker_intersection(tmp_path, monkeypatch):
    "Rule 1: only the intersection is compared; a tensor in one run only is reported separately, and fails the gate."
    import shutil
    monkeypatch.chdir(tmp_path)
    with pytest.warns(mdumps.TargetClassWarning): run_readme_example().saving_hook.remove()
    shutil.copytree(tmp_path/'tmp_tensors', tmp_path/'tmp_tensors_0')
    extra = sorted((tmp_path/'tmp_tensors_0'/'tensors'/'rank_0').glob('*.npy'))[-1]
    extra.unlink()                                                            # B lacks one tensor
    proc = _checker(tmp_path, '--pathA', 'tmp_tensors', '--pathB', 'tmp_tensors_0', '--no-progress')
    assert proc.returncode == 1 and f'FAIL tensors/rank_0/{extra.name}: only in A' in proc.stdout
    out = tmp_path/'tmp_tensors'/'tensors'/'compare_rst'
    assert extra.name not in (out/'rank_0_rst.csv').read_text()
    assert mcompare.read_csv(out/'rank_0_uncompared.csv') == [{'tensor_name': extra.name, 'reason': 'only in A'}]
    assert _checker(tmp_path, '--pathA', 'tmp_tensors', '--pathB', 'tmp_tensors_0', '--no-progress', '--allow-missing').returncode == 0

def test_saving_hook_under_miniai_learner(tmp_path):
    "The document's `Trainer(model).train()` is miniai's `Learner(model, dls, loss_func).fit(1)`: the hooked model saves its LayerNorms' outputs and gradients."
    from miniai.dumps import register_saving_hook
    from miniai.learner import Learner, TrainCB
    model = register_saving_hook(LLama13B(), path=tmp_path, target_class_names=['LayerNorm'])
    try: Learner(model, _token_dls(), _lm_loss, lr=0.1, cbs=[TrainCB()]).fit(1, valid=False)
    finally: model.saving_hook.remove()
    for kind, n in [('tensors', 4*3), ('grads', 4*6)]:   # 4 batches x 3 LayerNorms; gradients: their outputs' and 2 parameters'
        files = list((tmp_path/kind/'rank_0').glob('*layer_class_LayerNorm*.npy'))
        assert len(files) == n, (kind, len(files))
