"""`saturated` means values at a bound (the debuggers' `sat_low`/`sat_high`, the verdict's bounded activations); the fraction of
|x| at or above a histogram's `hi` is `overflow`, a note about the picture in every mode of `diagnose`, never a `saturated` finding.
A row's `row['saturated']`, that fraction's earlier name, still reads it with a DeprecationWarning."""
import pytest, torch
from torch import nn
from miniai.findings import THRESHOLDS, DiagnosisRow, stream_row, judge, format_finding
from miniai.kernel import Recorder

def _large_layer():
    "A recorder of a linear layer whose init is 100x too large: most of its values are past hi=10."
    torch.manual_seed(0)
    lin = nn.Linear(32, 32)
    with torch.no_grad(): lin.weight.mul_(100.)
    rec = Recorder()
    with torch.no_grad():
        for _ in range(4): rec.record(lin(torch.randn(64, 32)))
    return rec

@pytest.mark.parametrize('relative', [False, True])
def test_the_absolute_and_relative_modes_note_the_overflow_and_flag_no_saturation(relative):
    rec = _large_layer()
    row, found = stream_row('lin', rec, 0.5, THRESHOLDS, relative=relative)
    assert row['overflow'] == rec.overflow[-2:].mean().item() and row['overflow'] > 0.5
    assert 'saturated' not in row and 'saturated' not in {f['issue'] for f in found}
    assert [(n['issue'], n['value'], n['hi']) for n in row['notes']] == [('overflow', row['overflow'], 10.)]
    row, _ = stream_row('lin', rec, 0.5, THRESHOLDS.but(overflow=0.99), relative=relative)
    assert row['notes'] == []          # under the note's limit

def test_a_rows_saturated_is_the_old_name_of_overflow():
    row, _ = stream_row('lin', _large_layer(), 0.5, THRESHOLDS, relative=False)
    assert isinstance(row, DiagnosisRow)
    with pytest.warns(DeprecationWarning, match=r"row\['overflow'\]"): old = row['saturated']
    assert old == row['overflow']
    with pytest.raises(KeyError): DiagnosisRow(layer='x')['saturated']          # a row without the fraction has neither
    with pytest.raises(KeyError): row['no such key']

def test_judge_saturated_is_values_at_the_saturation_limits():
    found = judge('tanh', saturated=0.2)
    assert [f['issue'] for f in found] == ['saturated'] and 'at or beyond its saturation limits' in format_finding(found[0])
