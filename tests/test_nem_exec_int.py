"""Bit-exact quantized integer execution (decision NEM E3, E4): conv2d and gemm with per-channel requantization,
zero points, padding, strides, dilations and groups, against an independent reference written here with
Python integers (TFLite QuantizeMultiplier and gemmlowp's rounding from their published definitions)."""
import math
import numpy as np
import pytest
from nac_lab.nem.execution.exec import run
from nac_lab.nem.execution.memory import NemExecError
from nac_lab.core import data_path

# --- the independent reference -------------------------------------------------------------------
def qmul(M):
    "TFLite QuantizeMultiplier: (m0, shift) with M = m0 * 2**(shift - 31); m0 rounded half away from zero."
    if M == 0: return 0, 0
    q, e = math.frexp(M)
    m0 = int(math.floor(q * 2**31 + 0.5))
    if m0 == 2**31: m0, e = 2**30, e + 1
    return m0, e

def _wrap32(v): return ((v + 2**31) % 2**32) - 2**31

def srdhm(a, b):
    "gemmlowp SaturatingRoundingDoublingHighMul on Python ints."
    if a == b == -2**31: return 2**31 - 1
    ab = a * b
    nudge = 2**30 if ab >= 0 else 1 - 2**30
    s = ab + nudge
    return -((-s) // 2**31) if s < 0 else s // 2**31      # C division truncates toward zero

def rdbpot(x, e):
    "gemmlowp RoundingDivideByPOT: x / 2**e, to nearest, ties away from zero."
    if e == 0: return x
    q, r = divmod(abs(x), 2**e)
    if 2 * r >= 2**e: q += 1
    return q if x >= 0 else -q

def requant_ref(acc, M, zy, lo=-128, hi=127, single=False):
    m0, sh = qmul(M)
    if single:
        total = 31 - sh
        v = (acc * m0 + 2**(total - 1)) >> total
        v = max(-2**31, min(2**31 - 1, v))
    else:
        v = rdbpot(srdhm(_wrap32(acc * 2**max(sh, 0)), m0), max(-sh, 0))
    return max(lo, min(hi, v + zy))

def conv_acc_ref(x, w, zx, pads, strides, dil, groups):
    "int64 accumulators of an NHWC x HWIO convolution, zero point subtracted before padding (padding = real 0)."
    n, H, W_, C = x.shape; kh, kw, cg, K = w.shape
    xc = np.pad(x.astype(np.int64) - zx, [(0, 0), (pads[0], pads[2]), (pads[1], pads[3]), (0, 0)])
    Ho = (H + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    Wo = (W_ + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    kg = K // groups
    out = np.zeros((n, Ho, Wo, K), np.int64)
    for i in range(Ho):
        for j in range(Wo):
            for g in range(groups):
                for u in range(kh):
                    for v in range(kw):
                        px = xc[:, i * strides[0] + u * dil[0], j * strides[1] + v * dil[1], g * cg:(g + 1) * cg]
                        out[:, i, j, g * kg:(g + 1) * kg] += px @ w[u, v, :, g * kg:(g + 1) * kg].astype(np.int64)
    return out

def lst(a): return '[' + ', '.join(f'{v:g}' if isinstance(v, float) else str(v) for v in a) + ']'

# --- conv2d ------------------------------------------------------------------------------------------
@pytest.mark.parametrize('pads,strides,dil,groups', [([1, 1, 1, 1], [1, 1], [1, 1], 1), ([2, 1, 0, 2], [2, 1], [2, 2], 2), ([0, 0, 0, 0],
                                                                                                                            [2, 2], [1, 1],
                                                                                                                                4)])
def test_conv2d_int8_per_channel(pads, strides, dil, groups):
    rng = np.random.default_rng(sum(pads) * 7 + strides[0] + groups)
    N, H, W_, C, K, kh, kw = 1, 9, 8, 8, 8, 3, 3
    x = rng.integers(-128, 128, (N, H, W_, C), dtype=np.int8)
    w = rng.integers(-127, 128, (kh, kw, C // groups, K), dtype=np.int8)
    b = rng.integers(-3000, 3000, K).astype(np.int32)
    sx, zx, sy, zy = 0.04, -5, 0.25, 7
    sw = [float(f'{v:.5f}') for v in rng.uniform(0.001, 0.01, K)]
    Ho = (H + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // strides[0] + 1
    Wo = (W_ + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // strides[1] + 1
    prog = f'''program c:
buffer X : L2 (size={x.nbytes})
buffer Wt : L2 (size={w.nbytes})
buffer Bs : L2 (size={b.nbytes})
buffer Y : L2 (size={N * Ho * Wo * K})
x = region(X, 0, {x.nbytes}, elem=i8, shape={lst(x.shape)}, layout=NHWC, quant=per_tensor(scale={sx}, zero_point={zx}))
w = region(Wt, 0, {w.nbytes}, elem=i8, shape={lst(w.shape)}, layout=HWIO, quant=per_channel(axis=3, scales={lst(sw)}, zero_points={lst([0] * K)}))
b = region(Bs, 0, {b.nbytes}, elem=i32, shape=[{K}], layout=C)
y = region(Y, 0, {N * Ho * Wo * K}, elem=i8, shape=[{N}, {Ho}, {Wo}, {K}], layout=NHWC, quant=per_tensor(scale={sy}, zero_point={zy}))
t = conv2d.sync in x, w, b out y pads={lst(pads)} strides={lst(strides)} dilations={lst(dil)} groups={groups} accum_type=i32
'''
    got = run(prog, dict(X=x, Wt=w, Bs=b))['Y'].view(np.int8).reshape(N, Ho, Wo, K)
    acc = conv_acc_ref(x, w, zx, pads, strides, dil, groups) + b
    want = np.array([[requant_ref(int(a), sx * sw[c] / sy, zy) for c,
                      a in enumerate(row)] for row in acc.reshape(-1, K)]).reshape(got.shape)
    assert (got == want).all()

# --- gemm -------------------------------------------------------------------------------------------
def gemm_prog(M, Kd, N, sa, za, sb, sy, zy, dev=''):
    return dev + f'''program g:
buffer A : L2 (size={M * Kd})
buffer Bm : L2 (size={Kd * N})
buffer C : L2 (size={N * 4})
buffer Y : L2 (size={M * N})
a = region(A, 0, {M * Kd}, elem=i8, shape=[{M}, {Kd}], layout=MK, quant=per_tensor(scale={sa}, zero_point={za}))
b = region(Bm, 0, {Kd * N}, elem=i8, shape=[{Kd}, {N}], layout=KN, quant=per_channel(axis=1, scales={lst(sb)}, zero_points={lst([0] * N)}))
c = region(C, 0, {N * 4}, elem=i32, shape=[{N}], layout=C)
y = region(Y, 0, {M * N}, elem=i8, shape=[{M}, {N}], layout=MN, quant=per_tensor(scale={sy}, zero_point={zy}))
t = gemm.sync in a, b, c out y accum_type=i32
'''

def test_gemm_int8_per_channel_bias():
    rng = np.random.default_rng(11)
    M, Kd, N = 13, 70, 9
    a = rng.integers(-128, 128, (M, Kd), dtype=np.int8); b = rng.integers(-127, 128, (Kd, N), dtype=np.int8)
    c = rng.integers(-20000, 20000, N).astype(np.int32)
    sb = [float(f'{v:.6f}') for v in rng.uniform(0.0005, 0.02, N)]
    got = run(gemm_prog(M, Kd, N, 0.03, 4, sb, 0.3, -3), dict(A=a, Bm=b, C=c))['Y'].view(np.int8).reshape(M, N)
    acc = (a.astype(np.int64) - 4) @ b.astype(np.int64) + c
    want = np.array([[requant_ref(int(acc[i, j]), 0.03 * sb[j] / 0.3, -3) for j in range(N)] for i in range(M)])
    assert (got == want).all()

def test_gemm_single_rounding_device():
    "A device with NMU { requant_single_rounding = 1 } selects TFLite's single rounding (E3)."
    dev = f'''include "nem_baseline_1.0.nem"
device sr extends nem_baseline_1_0 {{
    topology {{
        num_engines = 1
        l2_size_bytes = 1048576
        per_engine {{ NMU = 1 CSTL = 1 DMA = 1 VPU = 1 SEQ = 1 l1_size_bytes = 65536 }}
    }}
    unit_characteristics {{ NMU {{ int8_macs = 256 requant_single_rounding = 1 }} }}
    opcode.mandatory {{ gemm.float<bf16>.no_bias }}
}}
'''
    rng = np.random.default_rng(5)
    M, Kd, N = 16, 33, 6
    a = rng.integers(-128, 128, (M, Kd), dtype=np.int8); b = rng.integers(-127, 128, (Kd, N), dtype=np.int8)
    c = rng.integers(-500, 500, N).astype(np.int32)
    sb = [0.0071, 0.013, 0.0022, 0.05, 0.0009, 0.017]
    got = run(gemm_prog(M, Kd, N, 0.02, 0, sb, 0.05, 1, dev), dict(A=a, Bm=b, C=c))['Y'].view(np.int8).reshape(M, N)
    acc = a.astype(np.int64) @ b.astype(np.int64) + c
    want = np.array([[requant_ref(int(acc[i, j]), 0.02 * sb[j] / 0.05, 1, single=True) for j in range(N)] for i in range(M)])
    assert (got == want).all()

# --- the example's ping-pong loop, with sampled reference checks --------------------------------------
def test_conv2d_relu_example_loop():
    rng = np.random.default_rng(21)
    X = rng.integers(-128, 128, (4, 16, 16, 64), dtype=np.int8)
    W = rng.integers(-127, 128, (3, 3, 64, 128), dtype=np.int8)
    B = rng.integers(-3000, 3000, 128).astype(np.int32)
    out = run(data_path('nem', 'examples', 'conv2d_relu_fixed.nem'), dict(X_L2=X, W_L2=W, B_L2=B))
    Y = out['Y_L2'].view(np.int8).reshape(4, 14, 14, 128)
    idx = rng.integers(0, [4, 14, 14, 128], (300, 4))           # deterministic sample of outputs
    for t, i, j, c in idx:
        acc = int((X[t, i:i + 3, j:j + 3, :].astype(np.int64) * W[:, :, :, c].astype(np.int64)).sum()) + int(B[c])
        assert Y[t, i, j, c] == max(0, requant_ref(acc, 0.05 * 0.02 / 0.1, 0)), (t, i, j, c)
    # the L1 ping-pong buffers hold the last two tiles' relu outputs, the L2 output all four
    assert (out['Y_L1'].view(np.int8).reshape(2, 14, 14, 128)[0] == Y[2]).all()

# --- quantized ops through float64 (E4), and integers without descriptors (ruling K3) ------------------
def test_quantized_eltwise_e4():
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, 64, dtype=np.int8); b = rng.integers(-128, 128, 64, dtype=np.int8)
    prog = '''program q:
buffer A : L2 (size=64)
buffer B : L2 (size=64)
buffer Y : L2 (size=64)
a = region(A, 0, 64, elem=i8, shape=[64], layout=C, quant=per_tensor(scale=0.05, zero_point=-3))
b = region(B, 0, 64, elem=i8, shape=[64], layout=C, quant=per_tensor(scale=0.02, zero_point=10))
y = region(Y, 0, 64, elem=i8, shape=[64], layout=C, quant=per_tensor(scale=0.07, zero_point=2))
t = mul.sync in a, b out y
'''
    got = run(prog, dict(A=a, B=b))['Y'].view(np.int8)
    want = []
    for p, q in zip(a.tolist(), b.tolist()):
        v = ((p + 3) * 0.05) * ((q - 10) * 0.02) / 0.07
        want.append(max(-128, min(127, round(v) + 2)))      # Python round: half to even
    assert got.tolist() == want

def test_int_without_quant_wraps_and_refuses():
    base = '''program w:
buffer A : L2 (size=16)
buffer Y : L2 (size=16)
a = region(A, 0, 16, elem=i32, shape=[4], layout=C)
y = region(Y, 0, 16, elem=i32, shape=[4], layout=C)
'''
    a = np.array([2**31 - 1, -2**31, 7, -7], np.int32)
    got = run(base + 't = add.sync in a, a out y\n', dict(A=a))['Y'].view(np.int32)
    assert got.tolist() == [-2, 0, 14, -14]
    with pytest.raises(NemExecError, match='exec.type'):
        run(base + 't = exp.sync in a out y\n', dict(A=a))

def test_quantized_pad_per_channel_constant_is_real():
    "pad on per-channel quantized i8: kept elements unchanged, padding = quantized real constant per channel (E4)."
    x = np.array([[10, -20], [30, 40]], np.int8)          # shape [2, 2], channels along axis 1
    prog = '''program p:
buffer A : L2 (size=4)
buffer Y : L2 (size=8)
a = region(A, 0, 4, elem=i8, shape=[2, 2], layout=NC, quant=per_channel(axis=1, scales=[0.5, 0.25], zero_points=[3, -4]))
y = region(Y, 0, 8, elem=i8, shape=[4, 2], layout=NC, quant=per_channel(axis=1, scales=[0.5, 0.25], zero_points=[3, -4]))
t = pad.sync in a out y pads=[1, 0, 1, 0] mode="constant" constant_value=1.0
'''
    got = run(prog, dict(A=x))['Y'].view(np.int8).reshape(4, 2)
    pad_row = [round(1.0 / 0.5) + 3, round(1.0 / 0.25) - 4]
    assert got.tolist() == [pad_row, [10, -20], [30, 40], pad_row]

def test_conv2d_int4_weights_packed_low_nibble_first():
    "conv2d.int4: i8 activations, i4 weights packed two per byte, element 2k in the low nibble (E1)."
    rng = np.random.default_rng(9)
    x = rng.integers(-128, 128, (1, 4, 4, 4), dtype=np.int8)
    w = rng.integers(-8, 8, (1, 1, 4, 2))                         # HWIO, 8 weights
    flat = (w.reshape(-1) & 0xF).astype(np.uint8)
    packed = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)   # 4 bytes
    prog = f'''program c4:
buffer X : L2 (size=64)
buffer Wt : L2 (size=4)
buffer Y : L2 (size=32)
x = region(X, 0, 64, elem=i8, shape=[1, 4, 4, 4], layout=NHWC, quant=per_tensor(scale=0.1, zero_point=0))
w = region(Wt, 0, 4, elem=i4, shape=[1, 1, 4, 2], layout=HWIO, quant=per_channel(axis=3, scales=[0.05, 0.02], zero_points=[0, 0]))
y = region(Y, 0, 32, elem=i8, shape=[1, 4, 4, 2], layout=NHWC, quant=per_tensor(scale=0.2, zero_point=0))
t = conv2d.sync in x, w out y pads=[0, 0, 0, 0] strides=[1, 1] dilations=[1, 1] groups=1 accum_type=i32
'''
    got = run(prog, dict(X=x, Wt=packed))['Y'].view(np.int8).reshape(1, 4, 4, 2)
    acc = x.astype(np.int64).reshape(16, 4) @ w.reshape(4, 2)
    want = np.array([[requant_ref(int(acc[i, c]), 0.1 * [0.05, 0.02][c] / 0.2,
                                  0) for c in range(2)] for i in range(16)]).reshape(1, 4, 4, 2)
    assert (got == want).all()
