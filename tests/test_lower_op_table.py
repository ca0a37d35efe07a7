"""One row per op the lowering supports (issue #30 item 3; the brief's table-driven op test): a tiny torch module and its input shape,
lowered in f32 (npm_pro_x1 with the f32 variants it lacks) within 1e-4 of the NAC interpreter and in int8 on npm_pro bit-exact
with the independent integer reference, `nem check` clean in both; then the refusals, each naming the op and its instruction."""
from types import SimpleNamespace
import numpy as np, pytest, torch, torch.nn as nn, torch.nn.functional as F
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.layers import LowerError
from f32_device import f32_device, F32_VARIANTS
from int_reference import reference_int8

@pytest.fixture(scope='module')
def f32dev(tmp_path_factory):
    return f32_device(tmp_path_factory.mktemp('dev'), F32_VARIANTS)

class Lin(nn.Module):
    "A linear first (int8 then has a requantized producer), then `f`; 4-D inputs get a 1x1 conv instead."
    def __init__(s, f, shape):
        super().__init__(); s.f = f
        s.p = nn.Conv2d(shape[1], shape[1], 1) if len(shape) == 4 else nn.Linear(shape[-1], shape[-1])
    def forward(s, x): return s.f(s.p(x))

T3, T4 = (1, 5, 6), (1, 4, 6, 6)
ROWS = {                                                   # op: (f, input shape)
    'linear': (nn.Linear(6, 7), T3),
    'conv2d': (nn.Conv2d(4, 5, 3, padding=1), T4),
    'conv2d_depthwise_stride2': (nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=4), T4),
    'matmul': (lambda y: y @ y.transpose(1, 2), T3),
    'add': (lambda y: y + y * 0.5, T3),
    'sub': (lambda y: y - torch.sigmoid(y) - 1.5, T3),
    'mul': (lambda y: y * y, T3),
    'div': (lambda y: y / 3.0, T3),
    'relu': (torch.relu, T3), 'gelu': (F.gelu, T3), 'silu': (F.silu, T3), 'sigmoid': (torch.sigmoid, T3), 'tanh': (torch.tanh, T3),
    'hardswish': (F.hardswish, T3), 'hardsigmoid': (F.hardsigmoid, T3), 'leaky_relu': (lambda y: F.leaky_relu(y, 0.2), T3),
    'clamp': (lambda y: torch.clamp(y, -0.5, 0.5), T3),
    'max_pool2d': (lambda y: F.max_pool2d(y, 2), T4),
    'avg_pool2d': (lambda y: F.avg_pool2d(y, 2), T4),
    'adaptive_avg_pool2d': (lambda y: F.adaptive_avg_pool2d(y, 1), T4),
    'pad': (lambda y: F.pad(y, (1, 1, 0, 2)), T4),
    'flatten': (lambda y: torch.flatten(y, 1), T4),
    'permute': (lambda y: y.permute(0, 2, 1) * 2.0, T3),
    'cat': (lambda y: torch.cat([y, y * 2.0], -1), T3),
    'slice': (lambda y: y[:, 1:4] * 2.0, T3),
    'softmax': (lambda y: torch.softmax(y, -1), T3),
    'layer_norm': (nn.LayerNorm(6), T3),
    'rms_norm': (nn.RMSNorm(6, eps=1e-6), T3),
    'mean': (lambda y: y.mean(-1, keepdim=True) + y, T3),
    'sum': (lambda y: y.sum(1), T3),
    'upsample_nearest2d': (lambda y: F.interpolate(y, scale_factor=2, mode='nearest'), T4),
    'upsample_bilinear2d': (lambda y: F.interpolate(y, scale_factor=2, mode='bilinear'), T4),
    'einsum': (lambda y: torch.einsum('bij,bkj->bik', y, y), T3),
    'roll': (lambda y: torch.roll(y, 2, 1), T3),
}

def _model(name):
    f, shape = ROWS[name]
    torch.manual_seed(0)
    return nac_compile(Lin(f, shape).eval(), (torch.zeros(shape),)), shape

@pytest.mark.parametrize('name', list(ROWS))
def test_op_row(f32dev, name):
    m, shape = _model(name)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    low = lower(m, f32dev, mode='f32', example=(xs[0],))
    assert not low.check().errors
    np.testing.assert_allclose(low.run(xs[0])[0], m.run(torch.from_numpy(xs[0]))[0].numpy(), atol=1e-4, rtol=0)
    low = lower(m, 'npm_pro', mode='int8', calib=xs)
    assert not low.check().errors
    raw = low.run_raw(*low.quantize_inputs(xs[0]).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(xs[0]))
    for o in low.graph.outputs:
        got = np.transpose(raw[o], (0, 3, 1, 2)) if low.io['outputs'][o]['layout'] == 'NHWC' else raw[o]
        np.testing.assert_array_equal(got, ref[o])

@pytest.mark.parametrize('f,msg', [
    (lambda y: (y != 0.5).float(), r'instruction \d+ \(nac\.ne\): nac\.ne \(a comparison\) has no NEM lowering: NEM has no comparison'),
    (lambda y: torch.linalg.vector_norm(y, 1, dim=-1), r'instruction \d+ \(\S*linalg_vector_norm\S*\): linalg_vector_norm of order 1'),
    (lambda y: torch.einsum('bii,bij->bj', y[:, :, :5], y), r"instruction \d+ \(aten\.einsum\.default\): einsum 'bii,bij->bj': a repeated"),
])
def test_refusals_name_op_and_instruction(f, msg):
    m = nac_compile(Lin(f, T3).eval(), (torch.zeros(T3),))
    with pytest.raises(LowerError, match=msg):
        lower(m, 'npm_pro', mode='float', example=(np.ones(T3, np.float32),))

def test_expand_of_a_non_unit_axis_is_refused():
    from nac_lab.lower.attn import import_more
    # a hand-made instruction 3: expand of a computed [2, 6] (value of instruction 1) to [4, 6]
    step = SimpleNamespace(index=3, name='nac.expand')
    vals = {1: SimpleNamespace(shape=(2, 6)), 3: SimpleNamespace(shape=(4, 6))}
    with pytest.raises(LowerError, match=r'instruction 3 \(nac\.expand\): broadcasting a computed \[2, 6\] to \[4, 6\]: axis 0 has size 2'):
        import_more(step, {'self': ('ref', 1), 'size': ('const', [4, 6])}, {1: 'x'}, vals, None, {})
