"""Every opcode of data/nem/opcodes.yaml runs on f32 operands through `nac_lab.nem.run`, against a float64 numpy
reference written here (ONNX meaning on NEM layouts, decision NEM E2)."""
import math
import numpy as np
import pytest
from nac_lab.nem.execution.exec import run
from nac_lab.nem.front.grammar import opcode_table

RNG = np.random.default_rng(42)

def reg(name, buf, shape, elem='f32', layout=None):
    n = math.prod(shape) * 4
    return (f'{name} = region({buf}, 0, {n}, elem={elem}, shape={list(shape)}, '
            f'layout={layout or "NHWC"[:len(shape)] if len(shape) <= 4 else "ABCDE"})\n')

def prog(ins, outs, task):
    "ins/outs: [(name, shape, elem)]; one buffer per operand."
    s = 'program o:\n'
    for n, sh, e in ins + outs:
        s += f'buffer B_{n} : L2 (size={max(4, math.prod(sh) * 4)})\n'
        sp = {1: 'W', 2: 'HW', 3: 'DHW'}.get(len(sh) - 2, '')
        plain = ''.join('NHWCDEFG'[k] for k in range(len(sh)))
        lay = (sp + 'IO') if n == 'w' and sp else ('N' + sp + 'C') if len(sh) >= 3 and sp else plain
        s += f'{n} = region(B_{n}, 0, {math.prod(sh) * 4}, elem={e}, shape={list(sh)}, layout={lay})\n'
    return s + task + '\n'

def go(ins, outs, task, data):
    out = run(prog(ins, outs, task), {f'B_{k}': v for k, v in data.items()})
    return {n: out[f'B_{n}'][:math.prod(sh) * 4].view(np.float32 if e == 'f32' else np.int32).reshape(sh) for n, sh, e in outs}

X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
P = (np.abs(X) + 0.5).astype(np.float32)
def gelu(v): return 0.5 * v * (1 + np.vectorize(math.erf)(v / math.sqrt(2)))
UN = dict(relu=lambda v: np.maximum(v, 0), sigmoid=lambda v: 1 / (1 + np.exp(-v)), tanh=np.tanh, exp=np.exp, log=np.log, sqrt=np.sqrt,
          abs=np.abs, neg=np.negative, gelu=gelu, silu=lambda v: v / (1 + np.exp(-v)))
BIN = dict(add=np.add, sub=np.subtract, mul=np.multiply, div=np.divide, min=np.minimum, max=np.maximum, pow=np.power)
S = (2, 3, 4)

@pytest.mark.parametrize('op', sorted(UN))
def test_unary(op):
    x = P if op in ('log', 'sqrt') else X
    y = go([('x', S, 'f32')], [('y', S, 'f32')], f't = {op}.sync in x out y', dict(x=x))['y']
    assert np.allclose(y, UN[op](x.astype(np.float64)), rtol=2e-7, atol=1e-30)

def test_leaky_relu_clamp():
    y = go([('x', S, 'f32')], [('y', S, 'f32')], 't = leaky_relu.sync in x out y alpha=0.1', dict(x=X))['y']
    assert (y == np.where(X < 0, X * np.float32(0.1), X)).all()
    y = go([('x', S, 'f32')], [('y', S, 'f32')], 't = clamp.sync in x out y min_val=-0.5 max_val=0.25', dict(x=X))['y']
    assert (y == np.clip(X, -0.5, 0.25)).all()

@pytest.mark.parametrize('op', sorted(BIN))
def test_binary(op):
    a, b = (P, X) if op == 'pow' else (X, P)
    y = go([('a', S, 'f32'), ('b', S, 'f32')], [('y', S, 'f32')], f't = {op}.sync in a, b out y', dict(a=a, b=b))['y']
    assert np.allclose(y, BIN[op](a.astype(np.float64), b.astype(np.float64)), rtol=2e-7)

def test_linear_and_conv_family():
    A = RNG.standard_normal((5, 7)).astype(np.float32)
    Bm = RNG.standard_normal((7, 3)).astype(np.float32); C = RNG.standard_normal(3).astype(np.float32)
    y = go([('a', (5, 7), 'f32'), ('b', (7, 3), 'f32')], [('y', (5, 3), 'f32')], 't = gemm.sync in a, b out y accum_type=f32',
           dict(a=A, b=Bm))['y']
    assert np.allclose(y, A.astype(np.float64) @ Bm, rtol=1e-5)
    h = '''program h:
buffer BA : L2 (size=70)
buffer BB : L2 (size=42)
buffer BC : L2 (size=6)
buffer BY : L2 (size=30)
a = region(BA, 0, 70, elem=f16, shape=[5, 7], layout=MK)
b = region(BB, 0, 42, elem=f16, shape=[7, 3], layout=KN)
c = region(BC, 0, 6, elem=f16, shape=[3], layout=N)
y = region(BY, 0, 30, elem=f16, shape=[5, 3], layout=MN)
t = gemm.sync in a, b, c out y accum_type=f32
'''
    A16, B16, C16 = A.astype(np.float16), Bm.astype(np.float16), C.astype(np.float16)
    y = run(h, dict(BA=A16, BB=B16, BC=C16))['BY'].view(np.float16).reshape(5, 3)
    assert np.allclose(y.astype(np.float64), A16.astype(np.float64) @ B16 + C16, rtol=2e-3, atol=2e-3)
    A3 = RNG.standard_normal((2, 5, 7)).astype(np.float32); B3 = RNG.standard_normal((2, 7, 3)).astype(np.float32)
    y = go([('a', (2, 5, 7), 'f32'), ('b', (2, 7, 3), 'f32')], [('y', (2, 5, 3), 'f32')], 't = matmul.sync in a, b out y accum_type=f32',
           dict(a=A3, b=B3))['y']
    assert np.allclose(y, A3.astype(np.float64) @ B3, rtol=1e-5)
    x = RNG.standard_normal((1, 6, 6, 4)).astype(np.float32)
    def ref(w, groups, pads, st, dil):
        N, H, W, Ci = x.shape; kh, kw, cg, Co = w.shape
        xp = np.pad(x.astype(np.float64), [(0, 0), (pads[0], pads[2]), (pads[1], pads[3]), (0, 0)])
        Ho = (H + pads[0] + pads[2] - dil[0] * (kh - 1) - 1) // st[0] + 1; Wo = (W + pads[1] + pads[3] - dil[1] * (kw - 1) - 1) // st[1] + 1
        out = np.zeros((N, Ho, Wo, Co)); og = Co // groups
        for i in range(Ho):
            for j in range(Wo):
                for g in range(groups):
                    for u in range(kh):
                        for v in range(kw):
                            out[:, i, j, g * og:(g + 1) * og] += xp[:, i * st[0] + u * dil[0], j * st[1] + v * dil[1],
                                                                    g * cg:(g + 1) * cg] @ w[u, v, :, g * og:(g + 1) * og]
        return out
    for opc, w, groups in (('conv2d', RNG.standard_normal((3, 3, 2, 6)).astype(np.float32), 2),
                           ('depthwise_conv2d', RNG.standard_normal((3, 3, 1, 4)).astype(np.float32), 4)):
        want = ref(w, groups, [1, 0, 1, 2], [2, 1], [1, 2])
        y = go([('x', x.shape, 'f32'), ('w', w.shape, 'f32')], [('y', want.shape, 'f32')],
               f't = {opc}.sync in x, w out y pads=[1, 0, 1, 2] strides=[2, 1] dilations=[1, 2] groups={groups} accum_type=f32',
                   dict(x=x, w=w))['y']
        assert np.allclose(y, want, rtol=1e-5, atol=1e-6), opc
    x1 = RNG.standard_normal((1, 9, 2)).astype(np.float32); w1 = RNG.standard_normal((3, 2, 3)).astype(np.float32)
    y = go([('x', x1.shape, 'f32'), ('w', w1.shape, 'f32')], [('y', (1, 7, 3), 'f32')],
           't = conv1d.sync in x, w out y pads=[0, 0] strides=[1] dilations=[1] accum_type=f32', dict(x=x1, w=w1))['y']
    assert np.allclose(y, np.stack([sum(x1[0, i + u] @ w1[u] for u in range(3)) for i in range(7)])[None], rtol=1e-5)
    x3 = RNG.standard_normal((1, 3, 3, 3, 2)).astype(np.float32); w3 = RNG.standard_normal((2, 2, 2, 2, 1)).astype(np.float32)
    y = go([('x', x3.shape, 'f32'), ('w', w3.shape, 'f32')], [('y', (1, 2, 2, 2, 1), 'f32')],
           't = conv3d.sync in x, w out y pads=[0, 0, 0, 0, 0, 0] strides=[1, 1, 1] dilations=[1, 1, 1] accum_type=f32',
               dict(x=x3, w=w3))['y']
    def tap(a, b, c):
        return sum((x3[0, a + u, b + v, c + t] * w3[u, v, t, :, 0]).sum() for u in range(2) for v in range(2) for t in range(2))
    want = np.array([[[[tap(a, b, c)] for c in range(2)] for b in range(2)] for a in range(2)])
    assert np.allclose(y[0], want, rtol=1e-5)

def test_views_reductions_norms():
    y = go([('x', S, 'f32')], [('y', (4, 2, 3), 'f32')], 't = transpose.sync in x out y perm=[2, 0, 1]',
           dict(x=X))['y']; assert (y == X.transpose(2, 0, 1)).all()
    y = go([('x', S, 'f32')], [('y', (6, 4), 'f32')], 't = reshape.sync in x out y target_shape=[6, 4]',
           dict(x=X))['y']; assert (y == X.reshape(6, 4)).all()
    y = go([('x', S, 'f32')], [('y', (2, 2, 2), 'f32')], 't = slice.sync in x out y starts=[0, 3] ends=[2, 0] axes=[1, 2] steps=[1, -2]',
           dict(x=X))['y']; assert (y == X[:, 0:2, 3:0:-2]).all()
    y = go([('a', S, 'f32'), ('b', S, 'f32')], [('y', (2, 6, 4), 'f32')], 't = concat.sync in a, b out y axis=1',
           dict(a=X, b=P))['y']; assert (y == np.concatenate([X, P], 1)).all()
    o = go([('x', S, 'f32')], [('y1', (2, 3, 1), 'f32'), ('y2', (2, 3, 3), 'f32')],
           't = split.sync in x out y1, y2 axis=2 split_sizes=[1, 3]', dict(x=X))
    assert (o['y1'] == X[:, :, :1]).all() and (o['y2'] == X[:, :, 1:]).all()
    y = go([('x', S, 'f32')], [('y', (2, 5, 4), 'f32')], 't = pad.sync in x out y pads=[0, 1, 0, 0, 1, 0] mode="reflect"',
           dict(x=X))['y']; assert (y == np.pad(X, [(0, 0), (1, 1), (0, 0)], mode='reflect')).all()
    x4 = X.reshape(1, 2, 3, 4)
    y = go([('x', (1, 2, 3, 4), 'f32')], [('y', (1, 1, 2, 4), 'f32')],
           't = maxpool.sync in x out y kernel_shape=[2, 2] pads=[0, 0, 0, 0] strides=[2, 1]', dict(x=x4))['y']
    assert (y[0, 0] == np.maximum(np.maximum(x4[0, 0, :2], x4[0, 0, 1:]), np.maximum(x4[0, 1, :2], x4[0, 1, 1:]))).all()
    for op, f in (('reduce_sum', np.sum), ('reduce_max', np.max), ('reduce_min', np.min)):
        y = go([('x', S, 'f32')], [('y', (2, 1, 1), 'f32')], f't = {op}.sync in x out y axes=[1, 2] keepdims=1', dict(x=X))['y']
        assert np.allclose(y, f(X.astype(np.float64), axis=(1, 2), keepdims=True), rtol=1e-6), op
    for op, f in (('argmax', np.argmax), ('argmin', np.argmin)):
        y = go([('x', S, 'f32')], [('y', (2, 3), 'i32')], f't = {op}.sync in x out y axis=2 keepdims=0', dict(x=X))['y']
        assert (y == f(X, axis=2)).all(), op
    sc = RNG.standard_normal(4).astype(np.float32); bi = RNG.standard_normal(4).astype(np.float32)
    y = go([('x', S, 'f32'), ('s', (4,), 'f32'), ('b', (4,), 'f32')], [('y', S, 'f32')],
           't = layernorm.sync in x, s, b out y axis=2 epsilon=0.001', dict(x=X, s=sc, b=bi))['y']
    x64 = X.astype(np.float64); ln = (x64 - x64.mean(2, keepdims=True)) / np.sqrt(x64.var(2, keepdims=True) + 1e-3) * sc + bi
    assert np.allclose(y, ln, rtol=1e-4, atol=1e-5)
    y = go([('x', S, 'f32'), ('s', (4,), 'f32')], [('y', S, 'f32')], 't = rmsnorm.sync in x, s out y axis=2 epsilon=0.001',
           dict(x=X, s=sc))['y']
    assert np.allclose(y, x64 / np.sqrt((x64 ** 2).mean(2, keepdims=True) + 1e-3) * sc, rtol=1e-4, atol=1e-5)
    y = go([('x', S, 'f32')], [('y', S, 'f32')], 't = log_softmax.sync in x out y axis=1', dict(x=X))['y']
    m = x64.max(1, keepdims=True); assert np.allclose(y, x64 - m - np.log(np.exp(x64 - m).sum(1, keepdims=True)), rtol=1e-5, atol=1e-6)

def test_every_opcode_is_covered_here():
    covered = set(UN) | set(BIN) | {'leaky_relu', 'clamp', 'gemm', 'matmul', 'conv2d', 'depthwise_conv2d', 'conv1d', 'conv3d', 'transpose',
                                    'reshape', 'slice',
               'concat', 'split', 'pad', 'maxpool', 'reduce_sum', 'reduce_max', 'reduce_min', 'argmax', 'argmin', 'layernorm', 'rmsnorm',
                   'log_softmax'}
    covered |= {'avgpool', 'gather', 'softmax', 'cast', 'quantize', 'dequantize'}      # in test_nem_exec_float.py
    assert set(opcode_table()) - covered == set()
