"""Adaptive average pools whose windows are not uniform (issue #30 item 2: AlexNet's AdaptiveAvgPool2d(6) after a 1x1 map, VGG's
(7, 7) after 2x2 at 64x64): a gather repeating each window to a common length, then a uniform pool. int8 bit-exact against the
independent integer reference, f32 within 1e-4 of the interpreter."""
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from int_reference import reference_int8
from f32_device import f32_device

class Head(nn.Module):
    "conv, adaptive average pool to `out`, flatten, linear: the classifier head of AlexNet / VGG at small inputs."
    def __init__(s, out, c=8):
        super().__init__(); s.c = nn.Conv2d(3, c, 3, padding=1); s.p = nn.AdaptiveAvgPool2d(out)
        s.f = nn.Linear(c * (out[0] * out[1] if isinstance(out, tuple) else out * out), 10)
    def forward(s, x): return s.f(torch.flatten(s.p(torch.relu(s.c(x))), 1))

CASES = [((1, 1), 6), ((2, 2), (7, 7)), ((5, 3), (3, 2)), ((4, 6), (2, 4))]      # (input map, output size)

@pytest.mark.parametrize('hw,out', CASES)
def test_adaptive_avg_int8_bit_exact(hw, out):
    torch.manual_seed(1)
    shape = (1, 3) + hw
    m = nac_compile(Head(out).eval(), (torch.zeros(shape),))
    cal = [np.random.default_rng(k).standard_normal(shape).astype(np.float32) for k in range(2)]
    low = lower(m, 'npm_pro_x1', mode='int8', calib=cal)
    assert not low.check().errors
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp['x'].quantize(x))
    for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])

@pytest.mark.parametrize('hw,out', CASES)
def test_adaptive_avg_f32_matches_interpreter(hw, out, tmp_path):
    torch.manual_seed(2)
    shape = (1, 3) + hw
    m = nac_compile(Head(out).eval(), (torch.zeros(shape),))
    x = np.random.default_rng(8).standard_normal(shape).astype(np.float32)
    dev = f32_device(tmp_path, ['view<f32>.default'])          # gather on f32 (a MAY variant the shipped devices lack)
    low = lower(m, dev, mode='f32', example=(x,))
    assert not low.check().errors
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)
