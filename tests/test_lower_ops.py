("Emission of matmul (activation x activation), transpose, concat, softmax, layernorm and rmsnorm: float against the NAC interpreter, "
 "int8 bit-exact against the integer reference, 4-D axes on NHWC storage.")
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from f32_device import f32_device
from int_reference import reference_int8      # lowering's layer walk, requantized independently of nac_lab.fxp (#28 item 7)

@pytest.fixture(scope='module')
def f32dev(tmp_path_factory):
    "npm_pro_x1 plus the f32 norm, softmax and view variants (MAY class): a device on which a transformer block lowers in f32."
    return f32_device(tmp_path_factory.mktemp('dev'), ('norm<f32>.default', 'softmax<f32>.default', 'view<f32>.default'))

class Block(nn.Module):
    "layernorm, q/k/v, q·kᵀ (transpose + matmul), softmax, ·v, concat, rmsnorm on [1, S, D]."
    def __init__(s, d=16):
        super().__init__()
        s.ln, s.q, s.k, s.v = nn.LayerNorm(d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        s.o, s.rms = nn.Linear(2 * d, d), nn.RMSNorm(d, eps=1e-6)
    def forward(s, x):
        h = s.ln(x)
        a = torch.softmax(s.q(h) @ s.k(h).transpose(1, 2), dim=-1)
        return s.rms(s.o(torch.cat([a @ s.v(h), h], dim=-1)))

class Products(nn.Module):
    "The int8-legal part: two activation matmuls, a transpose, a concat."
    def __init__(s, d=12):
        super().__init__()
        s.q, s.k, s.v, s.o = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(2 * d, 5)
    def forward(s, x):
        a = torch.relu(s.q(x) @ s.k(x).transpose(1, 2))
        return s.o(torch.cat([a @ s.v(x), x], dim=-1))

class Cat4(nn.Module):
    "4-D values (stored NHWC): a channel concat, a softmax over channels (float only), a permute, a flatten into a linear."
    def __init__(s, soft):
        super().__init__()
        s.c1, s.c2, s.fc, s.soft = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 6, 1), nn.Linear(10 * 5 * 6, 7), soft
    def forward(s, x):
        y = torch.cat([torch.relu(s.c1(x)), s.c2(x)], 1)
        if s.soft: y = torch.softmax(y, dim=1)
        return s.fc(torch.flatten(y.permute(0, 2, 3, 1), 1))

def _model(cls, shape, *a, seed=0):
    torch.manual_seed(seed)
    return nac_compile(cls(*a).eval(), (torch.zeros(shape),))

def _exact(low, x):
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
    for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])

@pytest.mark.parametrize('cls,shape,args', [(Block, (1, 8, 16), ()), (Products, (1, 6, 12), ()), (Cat4, (1, 3, 5, 6), (True,))])
def test_float_f32_matches_the_interpreter(f32dev, cls, shape, args):
    m = _model(cls, shape, *args)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    low = lower(m, f32dev, mode='float', example=(x,))
    assert low.elem == 'f32' and not low.check().errors
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

@pytest.mark.parametrize('cls,shape,args', [(Products, (1, 6, 12), ()), (Cat4, (1, 3, 5, 6), (False,))])
def test_int8_bit_exact(cls, shape, args):
    m = _model(cls, shape, *args, seed=2)
    rng = np.random.default_rng(3)
    low = lower(m, 'npm_lite', mode='int8', calib=[rng.standard_normal(shape).astype(np.float32) for _ in range(3)])
    assert {'matmul', 'transpose', 'concat'} & {l.op for l in low.graph.layers} and not low.check().errors
    _exact(low, rng.standard_normal(shape).astype(np.float32))

def test_shipped_device_takes_f16_and_int8_norm_is_an_f16_island():
    m = _model(Block, (1, 8, 16))
    x = np.random.default_rng(4).standard_normal((1, 8, 16)).astype(np.float32)
    low = lower(m, 'npm_lite', mode='float', example=(x,))
    assert low.elem == 'f16' and not low.check().errors
    yr = m.run(torch.from_numpy(x))[0].numpy()
    assert np.abs(low.run(x)[0] - yr).max() < 0.01 * np.abs(yr).max()
    rng = np.random.default_rng(6)
    low8 = lower(m, 'npm_lite', mode='int8', calib=[rng.standard_normal((1, 8, 16)).astype(np.float32) for _ in range(3)])
    assert not low8.check().errors and low8.program.count('dequantize.async') == 3            # layernorm, softmax, rmsnorm
    _exact(low8, x)
