"""A classifier fed vanishing activations (GoogLeNet with random weights at 64x64: 1e-11 before its linear layer) keeps its i32 bias
unsaturated (issue #30 item 2, the googlenet int8 disagreement): the lowered int8 program is bit-exact with the integer reference and
within 1% of float, top-1 included."""
import numpy as np, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from int_reference import reference_int8

class Tiny(nn.Module):
    def __init__(s): super().__init__(); s.c = nn.Conv2d(3, 8, 3); s.f = nn.Linear(8, 10)
    def forward(s, x): return s.f(torch.flatten(torch.relu(s.c(x)).mean((2, 3)) * 1e-11, 1))

def test_vanishing_input_keeps_bias():
    torch.manual_seed(3)
    m = nac_compile(Tiny().eval(), (torch.zeros(1, 3, 8, 8),))
    cal = [np.random.default_rng(k).standard_normal((1, 3, 8, 8)).astype(np.float32) for k in range(2)]
    low = lower(m, 'npm_pro_x1', mode='int8', calib=cal)
    assert np.abs(low.ql[next(l.name for l in low.graph.layers if l.op == 'linear')].bq.astype(np.int64)).max() <= 2**30
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp['x'].quantize(x))
    for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])
    yf = m.run(torch.from_numpy(x))[0].numpy()
    y8 = low.run(x)[0]
    assert np.abs(y8 - yf).max() <= 0.01 * np.abs(yf).max(), (y8, yf)       # the output is the bias: kept to a step of its scale
    assert y8.argmax() == yf.argmax()
