("4-D values in attention layout (PyTorch order) next to NHWC images: batched matmul, softmax and layernorm over the last axis of (B, H, "
 "S, D), relayouts where a conv meets them; float against the NAC interpreter, int8 bit-exact against the integer reference.")
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from f32_device import f32_device
from int_reference import reference_int8      # lowering's layer walk, requantized independently of nac_lab.fxp (#28 item 7)

@pytest.fixture(scope='module')
def f32dev(tmp_path_factory):
    "npm_pro_x1 plus the f32 norm, softmax and view variants (MAY class): the shipped devices have those in f16 only."
    return f32_device(tmp_path_factory.mktemp('dev'), ('norm<f32>.default', 'softmax<f32>.default', 'view<f32>.default'))

class Heads(nn.Module):
    "Multi-head attention on (B, H, S, D) with a layernorm over the head dimension, then a conv reading the result as an image."
    def __init__(s, d=16, h=2):
        super().__init__(); s.h = h; s.qkv = nn.Linear(d, d); s.ln = nn.LayerNorm(d // h); s.c = nn.Conv2d(h, 3, 3, padding=1)
    def forward(s, x):
        b, t, d = x.shape
        q = s.qkv(x).view(b, t, s.h, d // s.h).transpose(1, 2)
        a = torch.softmax(q @ q.transpose(2, 3), dim=-1)
        return s.c(s.ln(a @ q))

class ImageToSeq(nn.Module):
    "A conv image turned into a sequence (ViT-style), attention products on 4-D heads, back to an image for a conv (int8-legal ops only)."
    def __init__(s):
        super().__init__(); s.p = nn.Conv2d(3, 8, 2, 2); s.q = nn.Linear(8, 8); s.c = nn.Conv2d(2, 2, 3, padding=1)
    def forward(s, x):
        y = s.q(s.p(x).flatten(2).transpose(1, 2))                     # [1, 16, 8]
        h = y.view(1, 16, 2, 4).transpose(1, 2)                         # [1, 2, 16, 4]
        a = torch.relu(h @ h.transpose(2, 3))                           # [1, 2, 16, 16]
        return torch.relu(s.c(a @ h))                                   # conv over the (16, 4) "image" of each head

def _int8_equals_reference(low, x):
    "The lowered int8 program on one input equals the independent integer reference bit for bit (first output, program layout)."
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
    np.testing.assert_array_equal(raw[low.graph.outputs[0]], ref[low.graph.outputs[0]])

def _model(cls, shape, seed=0):
    torch.manual_seed(seed)
    return nac_compile(cls().eval(), (torch.zeros(shape),))

def test_4d_attention_f32(f32dev):
    m = _model(Heads, (1, 6, 16))
    x = np.random.default_rng(1).standard_normal((1, 6, 16)).astype(np.float32)
    low = lower(m, f32dev, mode='float', example=(x,), tiling='naive')
    ops = [l.op for l in low.graph.layers]
    assert low.elem == 'f32' and ops.count('matmul') == 2 and ops.count('relayout') == 1 and not low.check().errors
    assert low.graph.nhwc == {l.name for l in low.graph.layers if l.op in ('conv2d', 'relayout')}
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

def test_4d_products_int8_bit_exact():
    m = _model(ImageToSeq, (1, 3, 8, 8), seed=2)
    rng = np.random.default_rng(3)
    low = lower(m, 'npm_lite', mode='int8', calib=[rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(3)])
    ops = [l.op for l in low.graph.layers]
    assert ops.count('matmul') == 2 and ops.count('relayout') == 2 and not low.check().errors
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
    out = low.graph.outputs[0]
    np.testing.assert_array_equal(np.transpose(raw[out], (0, 3, 1, 2)), ref[out])     # the output is a conv's: NHWC in the program
    y = m.run(torch.from_numpy(x))[0].numpy()
    assert np.abs(low.run(x)[0] - y).max() < 0.1 * np.abs(y).max()

def _zoo(name):
    import warnings
    from nac_lab.nac.compiler.zoo import build_model, example_inputs
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        x = example_inputs(name)
        return nac_compile(build_model(name), x), tuple(t.numpy() for t in x)

@pytest.mark.parametrize('name', ['vit_tiny', 'gpt2', 'llama'])
def test_zoo_transformer_f32(f32dev, name):
    "The zoo's transformers lower in f32, check clean and match the NAC interpreter within 1e-4."
    m, xs = _zoo(name)
    low = lower(m, f32dev, mode='float', example=xs,
                tiling='search' if name == 'gpt2' else 'naive')     # one searched, to keep the time down
    r = low.check()
    assert low.elem == 'f32' and not r.errors, r.format()
    ops = {l.op for l in low.graph.layers}
    assert {'matmul', 'softmax', 'slice'} <= ops and ('gather' in ops) == (name != 'vit_tiny')
    np.testing.assert_allclose(low.run(*xs)[0], m.run(*[torch.from_numpy(x) for x in xs])[0].numpy(), atol=1e-4, rtol=0)

def test_gpt2_shipped_device_f16():
    "On npm_pro_x1 as shipped (norm/softmax/view in f16 only) gpt2 lowers to f16, its layers time alone for the report."
    m, xs = _zoo('gpt2')
    low = lower(m, 'npm_pro_x1', mode='float', example=xs, tiling='naive')
    assert low.elem == 'f16' and not low.check().errors
    yr = m.run(*[torch.from_numpy(x) for x in xs])[0].numpy()
    assert np.abs(low.run(*xs)[0] - yr).max() < 1e-3 * np.abs(yr).max()
    from nac_lab.lower.tile import layer_program, simulate_text, _macs          # the per-layer report's one-layer programs
    g = low.graph
    assert simulate_text(layer_program(g.layer('L2_embedding'), g, low.device, low.elem, None, None),
                         low.device).total_cycles > 0   # token input stays i32
    assert _macs(g.layer('L22_matmul'), g) == 4 * 16 * 16 * 16                  # q·kᵀ per head: [16, 16] x [16, 16]

class Rewrites(nn.Module):
    "The int8-legal rewrites of lower.attn: split/getitem, repeat_interleave, a scalar scale, a relu'd product."
    def forward(s, x):
        a, b = x.split(4, dim=-1)                                        # [1, 2, 6, 4] each
        k = torch.relu(b).repeat_interleave(2, dim=1)                   # [1, 4, 6, 4]
        return (a.repeat_interleave(2, dim=1) * 0.5) @ k.transpose(2, 3)

def test_rewrites_int8_bit_exact():
    torch.manual_seed(0)
    m = nac_compile(Rewrites().eval(), (torch.zeros(1, 2, 6, 8),))
    rng = np.random.default_rng(5)
    low = lower(m, 'npm_lite', mode='int8', calib=[rng.standard_normal((1, 2, 6, 8)).astype(np.float32) for _ in range(3)])
    assert {'slice', 'concat', 'mul_c', 'matmul'} <= {l.op for l in low.graph.layers} and not low.check().errors
    x = rng.standard_normal((1, 2, 6, 8)).astype(np.float32)
    _int8_equals_reference(low, x)

@pytest.mark.parametrize('name,islands', [('vit_tiny', 7), ('gpt2', 7), ('llama', 2)])
def test_zoo_transformer_int8_bit_exact(name, islands):
    ("int8 on npm_pro_x1: layernorms and softmaxes (with their causal masks) as f16 islands, the rewritten layers calibrated from "
     "eval_float; bit-exact.")
    from nac_lab.nac.compiler.zoo import example_inputs
    m, xs = _zoo(name)
    cal = [example_inputs(name, seed=s)[0].numpy() for s in (1, 2, 3)]
    low = lower(m, 'npm_pro_x1', mode='int8', calib=cal, tiling='naive')
    assert not low.check().errors and low.program.count('dequantize.async') == islands
    assert 'const' not in {l.op for l in low.graph.layers if not np.isfinite(l.params.get('v', 0)).all()}     # masks fused
    raw = low.run_raw(*low.quantize_inputs(*xs).values())
    n = next(iter(low.graph.inputs))
    ref = reference_int8(low.graph, low.qp, low.ql, xs[0] if n in low.graph.ints else low.qp[n].quantize(xs[0]))
    np.testing.assert_array_equal(raw[low.graph.outputs[0]], ref[low.graph.outputs[0]])

class RepeatKV(nn.Module):
    "Grouped-query attention's repeat of keys (llama's repeat_kv): unsqueeze, expand over a new head axis, view back to 4-D."
    def forward(s, x):
        q, k = x[:, :, :, :4], torch.relu(x[:, :2, :, 4:])                 # 4 query heads, 2 key heads
        k = k[:, :, None].expand(1, 2, 2, 6, 4).reshape(1, 4, 6, 4)
        return q @ k.transpose(2, 3)

def test_expand_float_and_int8_bit_exact(f32dev):
    "nac.expand is a concat of copies on each size-1 axis: f32 within 1e-5 of the interpreter, int8 bit-exact with the reference."
    torch.manual_seed(0)
    m = nac_compile(RepeatKV().eval(), (torch.zeros(1, 4, 6, 8),))
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 6, 8)).astype(np.float32)
    low = lower(m, f32dev, mode='float', example=(x,))
    assert low.elem == 'f32'
    cat = [l for l in low.graph.layers if l.op == 'concat']
    assert len(cat) == 1 and len(cat[0].inputs) == 2 and cat[0].attrs == dict(axis=2) and not low.check().errors
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-5, rtol=1e-5)
    low = lower(m, 'npm_lite', mode='int8', calib=[rng.standard_normal((1, 4, 6, 8)).astype(np.float32) for _ in range(3)])
    assert not low.check().errors
    _int8_equals_reference(low, x)

class WhereBaddbmm(nn.Module):
    "GPT-Neo's causal where (a constant mask, a scalar fill) and BLOOM's alibi baddbmm (a parameter bias plus scaled products)."
    def __init__(s):
        super().__init__()
        s.register_buffer('causal', torch.tril(torch.ones(1, 1, 6, 6, dtype=torch.bool)))
        s.register_buffer('fill', torch.tensor(-5.0)); s.alibi = nn.Parameter(torch.randn(2, 1, 6))
    def forward(s, x):                                                  # x: [1, 2, 6, 4]
        a = torch.where(s.causal, x @ x.transpose(2, 3), s.fill)        # [1, 2, 6, 6]
        b = torch.baddbmm(s.alibi, x[0], x[0].transpose(1, 2), beta=1.0, alpha=0.5)     # [2, 6, 6]
        return torch.relu(a + b[None])

def test_where_and_baddbmm_float_and_int8_bit_exact(f32dev):
    torch.manual_seed(0)
    m = nac_compile(WhereBaddbmm().eval(), (torch.zeros(1, 2, 6, 4),))
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 2, 6, 4)).astype(np.float32)
    low = lower(m, f32dev, mode='float', example=(x,))
    ops = [l.op for l in low.graph.layers]
    assert low.elem == 'f32' and ops.count('matmul') == 2 and 'mul_c' in ops and not low.check().errors
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-5, rtol=1e-5)
    low = lower(m, 'npm_lite', mode='int8', calib=[rng.standard_normal((1, 2, 6, 4)).astype(np.float32) for _ in range(3)])
    assert not low.check().errors
    _int8_equals_reference(low, x)
