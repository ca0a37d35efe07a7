"""Float execution (decision NEM E5, rulings K1-K5 of nem.kernels): f32 bit-exact IEEE, bf16/f16 widened exactly and
rounded to nearest even (reference: torch's conversions), views on bf16, ping-pong loops; transcendental and
reduction paths against float64 references."""
import math
import numpy as np
import pytest
import torch
from nac_lab.nem.execution.exec import run
from nac_lab.nem.execution.memory import NemExecError, f32_to_bf16, bf16_to_f32
from nac_lab.nem.execution.kernels import round_float

def bf16_bits(x_f32):
    "bf16 bit patterns of float32 values, by torch's round-to-nearest-even conversion."
    return torch.from_numpy(np.asarray(x_f32, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

def unary_prog(op, elem, n, attrs=''):
    nb = n * (4 if elem == 'f32' else 2)
    return f'''program u:
buffer A : L2 (size={nb})
buffer Y : L2 (size={nb})
a = region(A, 0, {nb}, elem={elem}, shape=[{n}], layout=C)
y = region(Y, 0, {nb}, elem={elem}, shape=[{n}], layout=C)
t = {op}.sync in a out y {attrs}
'''

def binary_prog(op, elem, n):
    nb = n * (4 if elem == 'f32' else 2)
    return f'''program b:
buffer A : L2 (size={nb})
buffer B : L2 (size={nb})
buffer Y : L2 (size={nb})
a = region(A, 0, {nb}, elem={elem}, shape=[{n}], layout=C)
b = region(B, 0, {nb}, elem={elem}, shape=[{n}], layout=C)
y = region(Y, 0, {nb}, elem={elem}, shape=[{n}], layout=C)
t = {op}.sync in a, b out y
'''

RNG = np.random.default_rng(7)
XA = (RNG.standard_normal(257) * 10 ** RNG.uniform(-3, 3, 257)).astype(np.float32)
XB = (RNG.standard_normal(257) * 10 ** RNG.uniform(-3, 3, 257)).astype(np.float32)
F32 = dict(add=np.add, sub=np.subtract, mul=np.multiply, div=np.divide, min=np.minimum, max=np.maximum)

@pytest.mark.parametrize('op', list(F32))
def test_f32_binary_bit_exact(op):
    got = run(binary_prog(op, 'f32', 257), dict(A=XA, B=XB))['Y'].view(np.uint32)
    assert (got == F32[op](XA, XB).view(np.uint32)).all()

@pytest.mark.parametrize('op', ['add', 'mul', 'div', 'max'])
def test_bf16_binary_rounds_once(op):
    a16, b16 = bf16_bits(XA), bf16_bits(XB)
    got = run(binary_prog(op, 'bf16', 257), dict(A=a16, B=b16))['Y'].view(np.uint16)
    wa = torch.from_numpy(a16.view(np.int16)).view(torch.bfloat16).float()
    wb = torch.from_numpy(b16.view(np.int16)).view(torch.bfloat16).float()
    ref = dict(add=wa + wb, mul=wa * wb, div=wa / wb, max=torch.maximum(wa, wb))[op]
    assert (got == bf16_bits(ref.numpy())).all()

def test_f16_relu_neg_abs_clamp():
    a = XA.astype(np.float16)
    for op, f, attrs in [('relu', lambda x: np.maximum(x, 0), ''), ('neg', np.negative, ''), ('abs', np.abs, ''),
                         ('clamp', lambda x: np.clip(x, np.float16(-0.5), np.float16(2.25)), 'min_val=-0.5 max_val=2.25')]:
        got = run(unary_prog(op, 'f16', 257, attrs), dict(A=a))['Y'].view(np.float16)
        assert (got.view(np.uint16) == f(a).astype(np.float16).view(np.uint16)).all(), op

def test_transcendentals_k1():
    "exp/tanh/sigmoid/gelu/silu: float64 evaluation rounded once to float32 (ruling K1), then to bf16 on store."
    a = (XA / 100).astype(np.float32)
    refs = dict(exp=math.exp, tanh=math.tanh, sigmoid=lambda v: 1 / (1 + math.exp(-v)),
                gelu=lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))), silu=lambda v: v / (1 + math.exp(-v)))
    for op, f in refs.items():
        got = run(unary_prog(op, 'f32', 257), dict(A=a))['Y'].view(np.float32)
        want = np.array([f(float(v)) for v in a], np.float64).astype(np.float32)
        assert (got.view(np.uint32) == want.view(np.uint32)).all(), op
        got16 = run(unary_prog(op, 'bf16', 257), dict(A=bf16_bits(a)))['Y'].view(np.uint16)
        w16 = bf16_to_f32(bf16_bits(a)).astype(np.float64)
        assert (got16 == bf16_bits(np.array([f(float(v)) for v in w16], np.float64).astype(np.float32))).all(), op

def test_round_float_single_rounding_exact():
    "float64 -> bf16 in one rounding (used by cast/dequantize), against an exact rational reference."
    from fractions import Fraction
    rng = np.random.default_rng(0)
    v = rng.standard_normal(400) * 2.0 ** rng.integers(-20, 20, 400)
    got = f32_to_bf16(round_float('bf16', v))
    for x, g in zip(v.tolist(), got.tolist()):
        m, e = math.frexp(abs(x))                      # x = m * 2**e, m in [0.5, 1): bf16 keeps 8 significant bits
        q = Fraction(abs(x)) / Fraction(2) ** (e - 8)
        r = math.floor(q); d = q - r
        r = r + 1 if d > Fraction(1, 2) or (d == Fraction(1, 2) and r % 2) else r
        want = math.copysign(float(Fraction(r) * Fraction(2) ** (e - 8)), x)
        assert bf16_to_f32(np.array([g], np.uint16))[0] == np.float32(want), x

def test_views_on_bf16():
    x = bf16_bits(XA[:24]).reshape(2, 3, 4)
    prog = '''program v:
buffer A : L2 (size=48)
buffer T : L2 (size=48)
buffer P : L2 (size=120)
buffer G : L2 (size=24)
buffer I : L2 (size=8)
a = region(A, 0, 48, elem=bf16, shape=[2, 3, 4], layout=NHW)
t = region(T, 0, 48, elem=bf16, shape=[4, 2, 3], layout=NHW)
p = region(P, 0, 120, elem=bf16, shape=[2, 5, 6], layout=NHW)
i = region(I, 0, 8, elem=i32, shape=[2], layout=C)
g = region(G, 0, 24, elem=bf16, shape=[2, 2, 3], layout=NHW)
t1 = transpose.async in a out t perm=[2, 0, 1]
t2 = pad.async in a out p pads=[0, 1, 0, 0, 1, 2] mode="constant" constant_value=0
t3 = gather.async in t, i out g axis=0
    deps=[t1]
'''
    idx = np.array([3, -4], np.int32)
    out = run(prog, dict(A=x, I=idx))
    xt = x.transpose(2, 0, 1)
    assert (out['T'].view(np.uint16).reshape(4, 2, 3) == xt).all()
    assert (out['P'].view(np.uint16).reshape(2, 5, 6) == np.pad(x, [(0, 0), (1, 1), (0, 2)])).all()
    assert (out['G'].view(np.uint16).reshape(2, 2, 3) == xt[[3, 0]]).all()

def test_pingpong_bf16_loop():
    "Two inputs added tile by tile through two L1 slots each, stored back; @max_in_flight(2)."
    T, n = 7, 16
    prog = f'''program pp:
buffer A : DDR (size={T * n * 2})
buffer B : DDR (size={T * n * 2})
buffer Y : DDR (size={T * n * 2})
buffer SA : L1[0] (size={2 * n * 2})
buffer SB : L1[0] (size={2 * n * 2})
buffer SY : L1[0] (size={2 * n * 2})
loop i in [0..{T - 1}] @max_in_flight(2):
    let a = region(SA, (i mod 2) * {n * 2}, {n * 2}, elem=bf16, shape=[{n}], layout=C)
    let b = region(SB, (i mod 2) * {n * 2}, {n * 2}, elem=bf16, shape=[{n}], layout=C)
    let y = region(SY, (i mod 2) * {n * 2}, {n * 2}, elem=bf16, shape=[{n}], layout=C)
    ta = transfer.async(dst=a, src=region(A, i * {n * 2}, {n * 2}))
    tb = transfer.async(dst=b, src=region(B, i * {n * 2}, {n * 2}))
    tc = add.async in a, b out y deps=[ta, tb]
    ts = store.async(dst=region(Y, i * {n * 2}, {n * 2}), src=y, deps=[tc])
endloop
wait(ts)
'''
    a16, b16 = bf16_bits(XA[:T * n]), bf16_bits(XB[:T * n])
    got = run(prog, dict(A=a16, B=b16))['Y'].view(np.uint16)
    wa = torch.from_numpy(a16.view(np.int16)).view(torch.bfloat16).float()
    wb = torch.from_numpy(b16.view(np.int16)).view(torch.bfloat16).float()
    assert (got == bf16_bits((wa + wb).numpy())).all()

def test_softmax_layernorm_close_to_float64():
    x = (XA[:64].reshape(4, 16) / 50).astype(np.float32)
    prog = '''program s:
buffer A : L2 (size=256)
buffer Y : L2 (size=256)
buffer Z : L2 (size=256)
a = region(A, 0, 256, elem=f32, shape=[4, 16], layout=NC)
y = region(Y, 0, 256, elem=f32, shape=[4, 16], layout=NC)
z = region(Z, 0, 256, elem=f32, shape=[4, 16], layout=NC)
t1 = softmax.async in a out y axis=1
t2 = layernorm.async in a out z axis=1 epsilon=0.00001
'''
    out = run(prog, dict(A=x))
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(1, keepdims=True)); sm = e / e.sum(1, keepdims=True)
    ln = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    assert np.allclose(out['Y'].view(np.float32).reshape(4, 16), sm, rtol=1e-5, atol=1e-7)
    assert np.allclose(out['Z'].view(np.float32).reshape(4, 16), ln, rtol=1e-4, atol=1e-5)

def test_memmove_and_overlap():
    base = '''program m:
buffer A : L2 (size=16)
'''
    a = np.arange(16, dtype=np.uint8)
    got = run(base + 't = transfer.sync(dst=region(A, 2, 8), src=region(A, 0, 8)) @memmove\n', dict(A=a))['A']
    assert got.tolist() == [0, 1, 0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15]

def test_pool_reduce_convert():
    "maxpool/avgpool (ruling K5), reductions, argmax, cast (K4), quantize and dequantize (E4) against direct references."
    x = XA[:2 * 5 * 5 * 3].reshape(2, 5, 5, 3)
    q = np.array([-128, -3, 0, 5, 127, 64, -64, 1], np.int8)
    prog = '''program p:
buffer A : L2 (size=600)
buffer MP : L2 (size=216)
buffer AP : L2 (size=216)
buffer RS : L2 (size=24)
buffer AM : L2 (size=200)
buffer CI : L2 (size=150)
buffer Q : L2 (size=8)
buffer DQ : L2 (size=32)
buffer QQ : L2 (size=150)
a = region(A, 0, 600, elem=f32, shape=[2, 5, 5, 3], layout=NHWC)
mp = region(MP, 0, 216, elem=f32, shape=[2, 3, 3, 3], layout=NHWC)
ap = region(AP, 0, 216, elem=f32, shape=[2, 3, 3, 3], layout=NHWC)
rs = region(RS, 0, 24, elem=f32, shape=[2, 3], layout=NC)
am = region(AM, 0, 200, elem=i32, shape=[2, 5, 5], layout=NHW)
ci = region(CI, 0, 150, elem=i8, shape=[2, 5, 5, 3], layout=NHWC)
q = region(Q, 0, 8, elem=i8, shape=[8], layout=C, quant=per_tensor(scale=0.5, zero_point=-3))
dq = region(DQ, 0, 32, elem=f32, shape=[8], layout=C)
qq = region(QQ, 0, 150, elem=i8, shape=[2, 5, 5, 3], layout=NHWC, quant=per_tensor(scale=0.125, zero_point=1))
t1 = maxpool.async in a out mp kernel_shape=[3, 3] pads=[1, 1, 1, 1] strides=[2, 2]
t2 = avgpool.async in a out ap kernel_shape=[3, 3] pads=[1, 1, 1, 1] strides=[2, 2]
t3 = reduce_sum.async in a out rs axes=[1, 2] keepdims=0
t4 = argmax.async in a out am axis=3 keepdims=0
t5 = cast.async in a out ci
t6 = dequantize.async in q out dq
t7 = quantize.async in a out qq
'''
    out = run(prog, dict(A=x, Q=q))
    xp = np.pad(x.astype(np.float64), [(0, 0), (1, 1), (1, 1), (0, 0)], constant_values=np.nan)
    win = np.array([[xp[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3] for j in range(3)] for i in range(3)])   # [3, 3, N, 3, 3, C]
    assert (out['MP'].view(np.float32).reshape(2, 3, 3, 3) == np.nanmax(win, axis=(3, 4)).transpose(2, 0, 1, 3).astype(np.float32)).all()
    assert np.allclose(out['AP'].view(np.float32).reshape(2, 3, 3, 3), np.nanmean(win, axis=(3, 4)).transpose(2, 0, 1, 3), rtol=1e-6)
    assert np.allclose(out['RS'].view(np.float32).reshape(2, 3), x.astype(np.float64).sum(axis=(1, 2)), rtol=1e-5)
    assert (out['AM'].view(np.int32).reshape(2, 5, 5) == x.argmax(axis=3)).all()
    assert (out['CI'].view(np.int8).reshape(x.shape) == np.clip(np.trunc(x.astype(np.float64)), -128, 127)).all()
    assert out['DQ'].view(np.float32).tolist() == [(v + 3) * 0.5 for v in q.tolist()]
    want = np.clip(np.array([round(float(v) / 0.125) + 1 for v in x.ravel()]), -128, 127)
    assert (out['QQ'].view(np.int8) == want).all()

def test_generic_compute_is_refused():
    prog = '''program g:
buffer A : L2 (size=16)
buffer Y : L2 (size=16)
a = region(A, 0, 16, elem=f32, shape=[4], layout=C)
y = region(Y, 0, 16, elem=f32, shape=[4], layout=C)
t = compute.async(op="my_op", attrs={k=1}, in=[a], out=[y])
'''
    with pytest.raises(NemExecError, match='exec.unsupported') as e: run(prog, dict(A=np.zeros(4, np.float32)))
    assert 'my_op' in str(e.value)
