"""pow with exponents 2, 3, 4 as eltwise products (issue #30 item 2: GPT-2's tanh GELU uses x**3); int8 bit-exact with the integer
reference, f32 within 1e-4 of the interpreter."""
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from int_reference import reference_int8

class Pow(nn.Module):
    def __init__(s, e): super().__init__(); s.e = e; s.f = nn.Linear(16, 16)
    def forward(s, x): y = s.f(x); return s.f(y + 0.044715 * torch.pow(y, s.e))

@pytest.mark.parametrize('e', [3, 4])
def test_pow_int8_and_f32(e):
    torch.manual_seed(e)
    m = nac_compile(Pow(e).eval(), (torch.zeros(1, 16),))
    cal = [np.random.default_rng(k).standard_normal((1, 16)).astype(np.float32) for k in range(3)]
    low = lower(m, 'npm_pro_x1', mode='int8', calib=cal)
    assert sum(l.op == 'mul' for l in low.graph.layers) == 2
    x = np.random.default_rng(9).standard_normal((1, 16)).astype(np.float32)
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp['x'].quantize(x))
    for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])
    lf = lower(m, 'npm_pro_x1', mode='f32', example=(x,))
    np.testing.assert_allclose(lf.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)
