"Int8 lowering is bit-exact against the whole-tensor integer reference whatever the tiling; float lowering matches the NAC interpreter."
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.nac import zoo
from nac_lab.lower.api import lower
from nac_lab.lower.layers import LowerError
from int_reference import reference_int8      # lowering's layer walk, requantized independently of nac_lab.fxp (#28 item 7)

class Mixed(nn.Module):
    "Convolutions of every kind the lowering tiles: stride 2, dilation, depthwise, grouped, 1x1, 5x5; pools; a residual add."
    def __init__(s):
        super().__init__()
        s.c1 = nn.Conv2d(3, 8, 3, 2, 1); s.dw = nn.Conv2d(8, 8, 3, 1, 2, dilation=2, groups=8); s.pw = nn.Conv2d(8, 12, 1)
        s.g = nn.Conv2d(12, 12, 5, 1, 2, groups=2); s.pool = nn.MaxPool2d(3, 2, 1); s.fc = nn.Linear(12, 5)
    def forward(s, x):
        y = torch.relu(s.c1(x)); y = s.pw(torch.relu(s.dw(y)) + y)
        y = s.pool(torch.sigmoid(s.g(y)))
        return s.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))

@pytest.fixture(scope='module')
def mixed():
    torch.manual_seed(0)
    return nac_compile(Mixed().eval(), (torch.zeros(1, 3, 21, 19),))

def _exact(m, low, shape, seed, n=2):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        x = rng.standard_normal(shape).astype(np.float32)
        raw = low.run_raw(*low.quantize_inputs(x).values())
        ref = reference_int8(low.graph, low.qp, low.ql, low.qp['x'].quantize(x))
        for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])

@pytest.mark.parametrize('tiling', ['search', 'naive', 1, 3, 4])
def test_mixed_int8_bit_exact_any_tiling(mixed, tiling):
    rng = np.random.default_rng(1)
    cal = [rng.standard_normal((1, 3, 21, 19)).astype(np.float32) for _ in range(4)]
    low = lower(mixed, 'npm_lite', mode='int8', calib=cal, tiling=tiling)
    assert not low.check().errors
    if isinstance(tiling, int): assert all(t.th == min(tiling, low.graph.layer(n).shape[2]) for n,
                                           t in low.tilings.items() if low.graph.layer(n).op == 'conv2d')
    _exact(mixed, low, (1, 3, 21, 19), 2)

def test_tiling_does_not_change_bits(mixed):
    "The program's raw output is identical for band heights 1, 2 and 5 and the searched tiling."
    rng = np.random.default_rng(3)
    cal = [rng.standard_normal((1, 3, 21, 19)).astype(np.float32) for _ in range(3)]
    x = rng.standard_normal((1, 3, 21, 19)).astype(np.float32)
    outs = []
    for t in (1, 2, 5, 'search'):
        low = lower(mixed, 'npm_mid', mode='int8', calib=cal, tiling=t)
        outs.append(low.run_raw(*low.quantize_inputs(x).values()))
    for o in outs[1:]:
        for k in o: np.testing.assert_array_equal(o[k], outs[0][k])

def test_mixed_float_x1(mixed):
    x = np.random.default_rng(4).standard_normal((1, 3, 21, 19)).astype(np.float32)
    low = lower(mixed, 'npm_pro_x1', mode='float', example=(x,), tiling=3)
    assert not low.check().errors
    np.testing.assert_allclose(low.run(x)[0], mixed.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

def test_resnet18_int8_and_float():
    m = nac_compile(zoo.build_model('resnet18'), (torch.zeros(1, 3, 32, 32),))
    rng = np.random.default_rng(5)
    cal = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(2)]
    low = lower(m, 'npm_lite', mode='int8', calib=cal)
    assert not low.check().errors
    _exact(m, low, (1, 3, 32, 32), 6, n=1)
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    lf = lower(m, 'npm_pro_x1', mode='float', example=(x,))
    assert not lf.check().errors
    np.testing.assert_allclose(lf.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

def test_errors(mixed):
    x = np.zeros((1, 3, 21, 19), np.float32)
    with pytest.raises(LowerError, match='unknown device'): lower(mixed, 'npm_nope', mode='int8', calib=[x])
    with pytest.raises(LowerError, match='calibration'): lower(mixed, 'npm_lite', mode='int8')
    with pytest.raises(LowerError, match='nearest variant on npm_pro'): lower(mixed, 'npm_pro', mode='f32', example=(x,))
    with pytest.raises(LowerError, match="mode must be"): lower(mixed, 'npm_lite', mode='int4', calib=[x])

@pytest.mark.parametrize('device,elem,tol', [('npm_mid', 'bf16', 0.03), ('npm_lite', 'f16', 0.005)])
def test_half_float_paths(mixed, device, elem, tol):
    ("Devices without f32 variants get bf16 (or f16) programs: tiling changes no bit, and the error against float32 stays within the "
     "type's precision.")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 3, 21, 19)).astype(np.float32)
    outs = []
    for t in ('search', 1, 'naive'):
        low = lower(mixed, device, mode='float', example=(x,), tiling=t)
        assert low.elem == elem and not low.check().errors
        outs.append(low.run_raw(*low.quantize_inputs(x).values()))
    for o in outs[1:]:
        for k in o: np.testing.assert_array_equal(o[k], outs[0][k])
    yf = mixed.run(torch.from_numpy(x))[0].numpy()
    y = low.run(x)[0]
    assert np.abs(y - yf).max() <= tol * np.abs(yf).max()

def test_mobilenet_int8_and_float():
    "Depthwise convs, hardswish/hardsigmoid (as add/clamp/mul), squeeze-excite's per-channel scale (a depthwise 1x1 conv)."
    m = nac_compile(zoo.build_model('mobilenet'), (torch.zeros(1, 3, 32, 32),))
    rng = np.random.default_rng(8)
    cal = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(2)]
    low = lower(m, 'npm_lite', mode='int8', calib=cal)
    assert not low.check().errors
    assert {'add_c', 'clamp', 'mul_c', 'bmul'} <= {l.op for l in low.graph.layers}
    _exact(m, low, (1, 3, 32, 32), 9, n=1)
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    lf = lower(m, 'npm_pro_x1', mode='float', example=(x,))
    assert not lf.check().errors
    np.testing.assert_allclose(lf.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)


def test_input_names_from_the_file_never_reach_the_program():
    "A NAC input name is text from the file: one that is not a plain NEM identifier becomes `in<k>`, so it cannot add statements."
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval()
    x = torch.randn(1, 8)
    nm = nac_compile(m, (x,))
    evil = 'x\nbuffer EVIL : DDR (size=1)\n#'
    nm.nac.input_names[0] = evil
    L = lower(nm, 'npm_pro_x1', mode='float', example=[x])
    assert 'EVIL' not in L.program and evil not in L.io['inputs']
    assert list(L.io['inputs']) == ['in0'] and L.io['inputs']['in0']['buffer'] == 'in0'
    assert not L.check().errors
    (y,) = L.run(x.numpy())
    np.testing.assert_allclose(np.asarray(y).reshape(1, 4), m(x).detach().numpy(), atol=1e-4)
