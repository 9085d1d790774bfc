"""Two gloo ranks under torchrun, each seeing half the batches, merge (all_reduce) into exactly what one process computes
(with `exact=True`), or, sampling (the default), into the same counts, ranges and zeros, means and stds to 1e-12, and
percentiles whose bounds overlap."""
import json, subprocess, sys, textwrap
from _torchrun import run_two_ranks, torchrun_env


WORKER = textwrap.dedent('''
    import json, os, sys, torch
    from torch import nn
    from miniai.learner import baseline_cnn, set_seed
    from miniai.statistics import StatisticsConfig, ActivationStatisticsHook

    def run(batches, out, distributed, EXACT):
        set_seed(0)
        model = baseline_cnn()                      # same weights on every rank
        cfg = StatisticsConfig(collect_percentiles=[1, 25, 50, 75, 99, 99.9], collect_sparsity=True,
                               collect_histogram=True, histogram_bins=20, max_samples=400, exact=EXACT)
        hook = ActivationStatisticsHook(cfg)
        with hook.attach(model, lambda m: not isinstance(m, nn.Sequential)), torch.no_grad():
            for i, xb in batches:
                model(xb)
                hook.update_statistics('small', None, xb[0, 0, 0, :10])          # exact percentiles (max_samples)
                if i == 3: hook.update_statistics('only_one_rank', None, xb * 3)  # a stream one rank never sees
        if distributed: hook.all_reduce()
        sd = hook.state_dict()
        res = dict(json=hook.export_statistics('json'), quant=hook.export_statistics('quantization'),
                   sketches={f"{s['name']}.{s['kind']}.{s['key']}": s.get('sketch') for s in sd['streams']},
                   exact={f"{s['name']}.{s['kind']}": 'values' in s for s in sd['streams']},
                   call_count=hook.call_count)
        with open(out, 'w') as f: json.dump(res, f)

    g = torch.Generator().manual_seed(1)
    data = [(i, torch.randn(16, 1, 28, 28, generator=g) * (1 + i % 3)) for i in range(12)]
    data[5][1][0, 0, 0, 0] = float('nan')                                    # a NaN, counted not averaged
    out_dir = sys.argv[1]
    for mode in ('exact', 'sampled'):   # both modes in one launch: starting processes is most of the cost
        EXACT = mode == 'exact'
        if len(sys.argv) > 2 and sys.argv[2] == 'single':
            run(data, os.path.join(out_dir, f'single_{mode}.json'), False, EXACT)
        else:
            import torch.distributed as dist
            if not dist.is_initialized(): dist.init_process_group('gloo')
            rank, world = dist.get_rank(), dist.get_world_size()
            run(data[rank::world], os.path.join(out_dir, f'rank{rank}_{mode}.json'), True, EXACT)
    if len(sys.argv) <= 2 or sys.argv[2] != 'single': dist.destroy_process_group()
''')


def _close(a, b, path=''):
    "Recursive comparison: equal structure, ints/strings exactly, floats to 1e-9 relative."
    if isinstance(a, dict):
        assert set(a) == set(b), (path, set(a) ^ set(b))
        for k in a:
            if k == 'last_updated': continue
            _close(a[k], b[k], f'{path}.{k}')
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)): _close(x, y, f'{path}[{i}]')
    elif isinstance(a, float) and isinstance(b, float):
        assert abs(a - b) <= 1e-9 * max(abs(a), abs(b)), (path, a, b)
    else: assert a == b, (path, a, b)


def two_rank_runs(d):
    "One process on all the batches, and two ranks on half each, for both modes: the folder of their results."
    script = d / 'worker.py'
    script.write_text(WORKER)
    subprocess.run([sys.executable, str(script), str(d), 'single'], check=True, env=torchrun_env(), timeout=120)
    proc = run_two_ranks(script, d, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return d

def _run(d, mode):
    single = json.loads((d / f'single_{mode}.json').read_text())
    ranks = [json.loads((d / f'rank{r}_{mode}.json').read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]                     # every rank holds the same global result
    merged = ranks[0]
    assert merged['exact'] == single['exact'] and merged['exact']['small.output']
    assert merged['call_count'] == single['call_count']
    out = single['json']['0.0']['input_stats']
    assert out['nonfinite'] == 1 and out['count'] == 12 * 16 * 28 * 28 - 1
    assert 'only_one_rank' in merged['json'] and merged['json']['only_one_rank']['total_samples'] == 16
    return single, merged


def test_all_reduce_two_ranks(tmp_path):
    "One launch of two ranks checks both modes (starting the processes is most of the cost)."
    d = two_rank_runs(tmp_path)
    check_exact(d); check_sampled(d)

def check_exact(d):
    "Exact mode: the merge of two ranks equals one process, to 1e-9 relative and with identical sketch counts."
    single, merged = _run(d, 'exact')
    assert merged['sketches'] == single['sketches']  # identical int64 sketch counts, so identical percentiles
    _close(merged['json'], single['json'])
    _close(merged['quant'], single['quant'])
    # percentiles match exactly, not only to 1e-9
    for name, st in single['json'].items():
        assert st['output_stats']['percentiles'] == merged['json'][name]['output_stats']['percentiles'], name


def check_sampled(d):
    "Sampling: each rank draws its own samples, so estimates differ, but never by more than their bounds say."
    single, merged = _run(d, 'sampled')
    assert set(merged['json']) == set(single['json'])
    for name, st in single['json'].items():
        for kind in ('input_stats', 'output_stats'):
            a, b = st[kind], merged['json'][name][kind]
            if a is None: assert b is None; continue
            # counted over every value, so exact however each rank sampled: counts, range and zeros equal, mean and std to 1e-12
            for k in ('count', 'nonfinite', 'min', 'max', 'sparsity_ratio'): assert a[k] == b[k], (name, kind, k, a[k], b[k])
            for x in (a, b):
                assert set(x['estimated']) <= {'percentiles', 'histogram'}, (name, kind, x['estimated'])
                assert x['errors'] == dict(mean=0., std=0., sparsity_ratio=0.), (name, kind, x['errors'])
            assert abs(a['mean'] - b['mean']) <= 1e-12 * (abs(a['mean']) + a['std']), (name, kind, a['mean'], b['mean'])
            assert abs(a['std'] - b['std']) <= 1e-12 * a['std'], (name, kind, a['std'], b['std'])
            for p, v in a['percentiles'].items():
                lo, hi = b['percentile_bounds'][p] if b.get('percentile_bounds') else (b['percentiles'][p],) * 2
                alo, ahi = a['percentile_bounds'][p] if a.get('percentile_bounds') else (v, v)
                assert max(lo, alo) <= min(hi, ahi), (name, kind, p)     # the two intervals overlap: both may hold the truth
