"""`diagnose` reads every output stream of a layer, and says where the first NaN/Inf appeared ("layer X, batch k")."""
import math
import pytest, torch
from torch import nn

from miniai.activations import ActivationStats, format_diagnosis


class Seq(nn.Module):
    "An LSTM (three output streams: output, h, c) and a linear head."
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm, self.head = nn.LSTM(4, 5, batch_first=True), nn.Linear(5, 2)
    def forward(self, x): return self.head(self.lstm(x)[0][:, -1])


def test_every_output_stream_gets_a_row():
    m, a = Seq(), ActivationStats(layers=['lstm', 'head'])
    with a.attach(m):
        for _ in range(3): m(torch.randn(2, 3, 4))
    rows = a.diagnose()
    assert [(r['layer'], r['output']) for r in rows] == [('lstm', 'output'), ('lstm[1.0]', 'output[1.0]'), ('lstm[1.1]', 'output[1.1]'), ('head', 'output')]
    recs = a.recorders['train']['lstm']
    for r in rows[:3]:
        rec = recs[r['output']]
        assert r['std'] == pytest.approx(rec.stds[-1].item()) and r['mean'] == pytest.approx(rec.means[-1].item())   # tail 0.1 of 3: the last
    assert len(format_diagnosis(rows).splitlines()) == 5      # header and four rows, no NaN line


class Blows(nn.Module):
    "Three layers; from forward `at` on, the middle one's output is NaN in one place, and the last one's follows."
    def __init__(self, at):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c, self.at, self.n = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3), at, 0
    def forward(self, x):
        self.n += 1
        y = self.b(self.a(x))
        if self.n > self.at: y = y.clone(); y[0, 0] = math.nan
        return self.c(y)


def test_first_nonfinite_located():
    m, a = Blows(at=2), ActivationStats(every=1)
    with a.attach(m):
        for _ in range(5): m(torch.randn(4, 3))
    rows = {r['layer']: r for r in a.diagnose()}
    assert rows['a']['nonfinite'] == 0 and rows['b']['nonfinite'] == 0      # the hook on b sees its output before the NaN is put in
    first = [f for r in rows.values() for f in r['findings'] if f.get('first')]
    assert len(first) == 1 and (first[0]['layer'], first[0]['batch']) == ('c', 2)
    assert [f['batch'] for f in rows['c']['findings'] if f['measure'] == 'nonfinite'] == [2]
    assert format_diagnosis(a.diagnose()).splitlines()[-1] == 'first NaN/Inf: layer c, batch 2 (of the recorded batches, from 0)'


def test_first_nonfinite_is_the_earliest_batch_then_the_first_layer():
    class Two(nn.Module):
        def __init__(self):
            super().__init__(); torch.manual_seed(0); self.p, self.q, self.n = nn.Linear(2, 2), nn.Linear(2, 2), 0
        def forward(self, x):
            self.n += 1
            if self.n == 3: x = x * math.inf      # batch 2: both layers at once; p comes first
            y = self.p(x)
            if self.n == 2: y = y * math.nan      # batch 1: q only
            return self.q(y)
    m, a = Two(), ActivationStats()
    with a.attach(m):
        for _ in range(4): m(torch.randn(3, 2))
    first = [(f['layer'], f['batch']) for r in a.diagnose() for f in r['findings'] if f.get('first')]
    assert first == [('q', 1)]
    assert [f['batch'] for r in a.diagnose() for f in r['findings'] if r['layer'] == 'p' and 'batch' in f] == [2]
