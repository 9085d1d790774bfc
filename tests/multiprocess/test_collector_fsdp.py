"""The run-wide collector with `collect_weights` and `collect_param_grads` under DDP and FSDP2 (`fully_shard`) in a hand-written loop
on two CPU ranks (gloo): training runs (each rank reads what it holds of a parameter, see `ParamBook`), and after `all_reduce()` every
rank holds what one process collects on the same batches whole: a parameter read whole on every rank counted once, shards joined."""
import sys, json, math
from pathlib import Path
from _torchrun import run_two_ranks

HERE = Path(__file__).parents[1]/'support'   # the scripts torchrun runs
sys.path.insert(0, str(HERE))
import _fsdp_collector

def close(a, b): return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)

def test_collector_params_and_grads_under_ddp_and_fsdp2_merge_to_one_process(tmp_path):
    res = run_two_ranks(HERE/'_fsdp_collector.py', tmp_path, 'ddp', 'fsdp', timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    _fsdp_collector.run('single', tmp_path)
    single = json.loads((tmp_path/'collector_single_rank0.json').read_text())
    assert list(single) == ['0', '2', '4'] and set(single['0']['param_grads']) == {'weight', 'bias'}
    for mode in ('ddp', 'fsdp'):
        for r in (0, 1):
            got = json.loads((tmp_path/f'collector_{mode}_rank{r}.json').read_text())
            assert list(got) == list(single), (mode, r)
            for layer, want in single.items():
                for part in ('input_stats', 'output_stats'):
                    a, b = got[layer][part], want[part]
                    assert a['count'] == b['count'] and a['min'] == b['min'] and a['max'] == b['max'], (mode, r, layer, part)
                    assert close(a['mean'], b['mean']) and close(a['std'], b['std']), (mode, r, layer, part)
                for part in ('params', 'param_grads'):
                    assert set(got[layer][part]) == set(want[part]), (mode, r, layer, part)
                    for pn, b in want[part].items():
                        a = got[layer][part][pn]
                        assert a['count'] == b['count'], (mode, r, layer, part, pn)     # whole parameters once, shards joined
                        assert close(a['min'], b['min']) and close(a['max'], b['max']), (mode, r, layer, part, pn)
                        assert close(a['mean'], b['mean']) and math.isclose(a['std'], b['std'], rel_tol=1e-9), (mode, r, layer, part, pn)
