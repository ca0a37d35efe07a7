("The rewrites of lower.more, one tiny module each: f32 within 1e-4 of the NAC interpreter, int8 bit-exact with the independent integer "
 "reference, nem check clean; and the ops that stay refused, with their message.")
import numpy as np, pytest, torch, torch.nn as nn, torch.nn.functional as F
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.layers import LowerError
from f32_device import f32_device, F32_VARIANTS
from int_reference import reference_int8

@pytest.fixture(scope='module')
def f32dev(tmp_path_factory):
    return f32_device(tmp_path_factory.mktemp('dev'), F32_VARIANTS)

class Fn(nn.Module):
    "A linear (so that int8 has a requantized producer) then `f`."
    def __init__(s, f, d=6):
        super().__init__(); s.l, s.f = nn.Linear(d, d), f
    def forward(s, x): return s.f(s.l(x))

class Aff(nn.Module):
    "ResMLP's affine: addcmul(beta, alpha, x)."
    def __init__(s, d=6):
        super().__init__(); s.a, s.b = nn.Parameter(torch.randn(d)), nn.Parameter(torch.randn(d))
    def forward(s, x): return torch.addcmul(s.b, s.a, x)

def _win(x):
    "Swin's window partition of a [1, 4, 4, 6] value into 2x2 windows (a rank-6 permute) and back, with a roll between."
    w = x.view(1, 2, 2, 2, 2, 6).permute(0, 1, 3, 2, 4, 5).reshape(-1, 2, 2, 6)
    w = torch.roll(w, (1, -1), (1, 2))
    return w.view(1, 2, 2, 2, 2, 6).permute(0, 1, 3, 2, 4, 5).reshape(1, 4, 4, 6)

def _ein(q):
    "MaxViT's two einsums: scores q·kᵀ per head, then the weighted sum of values."
    a = torch.einsum('b h i d, b h j d -> b h i j', q, q * 0.5)
    return torch.einsum('b h i j, b h j d -> b h i d', torch.softmax(a, -1), q)

CASES = {                                           # name: (f, input shape)
    'mean_tokens': (lambda y: y.mean(1), (1, 5, 6)),
    'mean_two_axes': (lambda y: y.mean((1, 2), keepdim=True), (1, 3, 4, 6)),
    'vector_norm_last': (lambda y: y / torch.linalg.vector_norm(y, dim=-1, keepdim=True), (1, 5, 6)),
    'vector_norm_spatial': (lambda y: torch.linalg.vector_norm(y, 2, dim=(1, 2), keepdim=True) + y, (1, 3, 4, 6)),
    'leaky_relu': (lambda y: F.leaky_relu(y, 0.1), (1, 5, 6)),
    'div_computed': (lambda y: y / (y[..., -1:] * y[..., -1:] + 1.0), (1, 5, 6)),
    'div_number': (lambda y: y / 3.0, (1, 5, 6)),
    'mul_broadcast_axis1': (lambda y: y * y.mean(1, keepdim=True), (1, 4, 3, 6)),
    'mul_broadcast_wide': (lambda y: y * y.mean(1, keepdim=True) + y / y.mean((1, 2), keepdim=True), (1, 12, 3, 6)),
    'roll': (lambda y: torch.roll(y, (2, -1), (1, 2)), (1, 4, 3, 6)),
    'window_partition': (_win, (1, 4, 4, 6)),
    'qkv_permute_rank5': (lambda y: y.reshape(1, 5, 3, 2, 1).permute(2, 0, 3, 1, 4).reshape(3, 2, 5), (1, 5, 6)),
    'normalize_clamp_min': (lambda y: F.normalize(y, dim=-1) + torch.clamp_max(y, 0.5), (1, 5, 6)),
    'expand_wide': (lambda y: y[:, :1].expand(1, 20, 6) * y.mean(1, keepdim=True).expand(1, 20, 6), (1, 5, 6)),
    'sdpa_query_blocks': (lambda y: F.scaled_dot_product_attention(y, y * 0.5, y, is_causal=True), (1, 2, 240, 6)),
    'sum_axis': (lambda y: y.sum(1) + y.sum(-1).sum(-1, keepdim=True), (1, 5, 6)),
    'einsum_attention': (lambda y: _ein(y.reshape(1, 5, 2, 3).permute(0, 2, 1, 3)), (1, 5, 6)),
    'bilinear_x2': (lambda y: F.interpolate(y, scale_factor=2, mode='bilinear'), (1, 3, 4, 6)),
    'bilinear_size_corners': (lambda y: F.interpolate(y, size=(7, 5), mode='bilinear', align_corners=True), (1, 3, 4, 6)),
    'einsum_permuted_out': (lambda y: torch.einsum('bij,bkj->kbi', y, y * 0.5), (1, 5, 6)),
}

def _model(name, seed=0):
    f, shape = CASES[name]
    torch.manual_seed(seed)
    return nac_compile(Fn(f).eval(), (torch.zeros(shape),)), shape

@pytest.mark.parametrize('name', list(CASES))
def test_float_f32(f32dev, name):
    m, shape = _model(name)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    low = lower(m, f32dev, mode='f32', example=(x,))
    assert not low.check().errors
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

def _int8(m, shape, seed=3):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    low = lower(m, 'npm_pro', mode='int8', calib=xs)
    assert not low.check().errors
    x = xs[0]
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
    for o in low.graph.outputs:
        got = np.transpose(raw[o], (0, 3, 1, 2)) if low.io['outputs'][o]['layout'] == 'NHWC' else raw[o]
        np.testing.assert_array_equal(got, ref[o])
    y, yr = low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy()
    assert np.abs(y - yr).max() <= 0.1 * np.abs(yr).max() + 0.02
    return low

@pytest.mark.parametrize('name', list(CASES))
def test_int8_bit_exact(name):
    _int8(*_model(name, seed=2))

def test_addcmul_with_constants_is_one_diagonal_linear(f32dev):
    torch.manual_seed(0)
    m = nac_compile(Aff().eval(), (torch.zeros(1, 5, 6),))
    x = np.random.default_rng(1).standard_normal((1, 5, 6)).astype(np.float32)
    low = lower(m, f32dev, mode='f32', example=(x,))
    assert [l.op for l in low.graph.layers] == ['linear'] and not low.check().errors
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-5, rtol=0)
    _int8(m, (1, 5, 6))

def test_merge_views_rewrites_the_rank6_transpose_to_rank4():
    from nac_lab.lower.graph import import_nac
    m, shape = _model('window_partition')
    g = import_nac(m, np.zeros(shape, np.float32))
    assert max(len(l.shape) for l in g.layers) <= 4
    assert [l.attrs['perm'] for l in g.layers if l.op == 'transpose'] == [[0, 2, 1, 3]] * 2

@pytest.mark.parametrize('f,msg', [
    (lambda y: torch.linalg.vector_norm(y, 1, dim=-1), r'linalg_vector_norm of order 1 is not lowered \(only the 2-norm'),
    (lambda y: torch.div(y, y, rounding_mode='floor'), r'aten\.div\.Tensor_mode has no NEM lowering'),
])
def test_refusals_name_the_op(f, msg):
    m = nac_compile(Fn(f).eval(), (torch.zeros(1, 5, 6),))
    with pytest.raises(LowerError, match=msg):
        lower(m, 'npm_pro', mode='float', example=(np.ones((1, 5, 6), np.float32),))

def test_large_attention_is_split_into_query_blocks():
    from nac_lab.lower.graph import import_nac
    from nac_lab.lower.attn import attn_rows
    assert attn_rows(2, 240, 240, 6, 6) == 183 and attn_rows(2, 200, 200, 6, 6) == 200        # (393216 - 23040) // 2016; one block
    m, shape = _model('sdpa_query_blocks')
    g = import_nac(m, np.zeros(shape, np.float32))
    assert [l.op for l in g.layers].count('softmax') == 2 and [l.shape for l in g.layers if l.op == 'softmax'] == [(1, 2, 183, 240),
                                                                                                                   (1, 2, 57, 240)]

def test_attention_blocks_follow_the_l1_size(tmp_path):
    from nac_lab.lower.graph import import_nac
    from nac_lab.lower.attn import attn_block_bytes, attn_rows
    from test_lower_tiling import small_device
    # 3/8 of L1: 393216 for 1 MiB; a halved L1 (512 KiB) gives 196608: (196608 - 23040) // 2016 = 86 rows per block
    assert attn_block_bytes(1 << 20) == 393216 and attn_block_bytes(1 << 19) == 196608
    assert attn_rows(2, 240, 240, 6, 6, attn_block_bytes(1 << 19)) == 86
    m, shape = _model('sdpa_query_blocks')
    g = import_nac(m, np.zeros(shape, np.float32), l1=1 << 19)
    assert [l.shape for l in g.layers if l.op == 'softmax'] == [(1, 2, 86, 240), (1, 2, 86, 240), (1, 2, 68, 240)]
    dev = small_device(tmp_path, 1 << 19)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    low = lower(m, dev, mode='int8', calib=xs)
    assert not low.check().errors and [l.op for l in low.graph.layers].count('softmax') == 3
    raw = low.run_raw(*low.quantize_inputs(xs[0]).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(xs[0]))
    for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])

def test_bilinear_matrix_by_hand():
    from nac_lab.lower.more import bilinear_matrix
    # 2 -> 4, half pixels: src = (i + 0.5) / 2 - 0.5 = -0.25 (clamped to 0), 0.25, 0.75, 1.25 (the last input repeated)
    np.testing.assert_allclose(bilinear_matrix(2, 4, False), [[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]])
    # 3 -> 5 with corners aligned: src = i * 2 / 4 = 0, 0.5, 1, 1.5, 2
    np.testing.assert_allclose(bilinear_matrix(3, 5, True), [[1, 0, 0], [0.5, 0.5, 0], [0, 1, 0], [0, 0.5, 0.5], [0, 0, 1]])
    x = torch.arange(6.0).reshape(1, 1, 2, 3)
    for ac in (False, True):
        y = F.interpolate(x, size=(5, 4), mode='bilinear', align_corners=ac)[0, 0].numpy()
        np.testing.assert_allclose(bilinear_matrix(2, 5, ac) @ x[0, 0].numpy() @ bilinear_matrix(3, 4, ac).T, y, atol=1e-6)
