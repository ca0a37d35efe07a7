"""ARK executor: random strided/padded views against flat index arithmetic, overlapping writes, a 4-rank
all-reduce and the 2-rank tensor-parallel MLP (FP32 and FP16) against numpy/torch, the real tutorial graph
at reduced size against torch, and the CLI."""
import math
import numpy as np
import pytest
import torch, torch.nn.functional as F
from nac_lab.core import data_path
from nac_lab.cli import run_cli
from nac_lab.ark.format import read_ark, ark_text
from nac_lab.ark.check import ArkBuilder, tp_mlp
from nac_lab.ark.exec import ArkExecutor, ArkExecError, resize


def _flat_index(idx, offsets, strides):
    "Element index of `idx` in a region of sizes `strides` (decision ARK 5), written out independently."
    pos = 0
    for d in range(len(strides)):
        pos = pos * strides[d] + offsets[d] + idx[d]
    return pos


@pytest.mark.parametrize('seed', range(12))
def test_random_windows_against_index_arithmetic(seed):
    g = np.random.default_rng(seed)
    nd = int(g.integers(1, 5))
    strides = tuple(int(x) for x in g.integers(2, 6, nd))
    shape = tuple(int(g.integers(1, s + 1)) for s in strides)
    padded = tuple(int(g.integers(sh, st + 1)) for sh, st in zip(shape, strides))
    offsets = tuple(int(g.integers(0, st - p + 1)) for st, p in zip(strides, padded))
    b = ArkBuilder()
    whole = b.tensor((math.prod(strides),))
    win = b.tensor(shape, strides=strides, offsets=offsets, padded=padded, buffer=whole.buffer)
    src = b.tensor(shape)
    b.copy(src, out=win)
    tot = b.scalar_mul(b.view(whole, (math.prod(strides),)), 2.0)
    ex = ArkExecutor(b.model())
    base = g.standard_normal(math.prod(strides)).astype(np.float32)
    val = g.standard_normal(shape).astype(np.float32)
    ex.set(whole.id, base); ex.set(src.id, val); ex.run()
    want = base.copy()
    for idx in np.ndindex(*shape): want[_flat_index(idx, offsets, strides)] = val[idx]
    np.testing.assert_array_equal(ex.get(tot.id), want * 2)


def test_padding_starts_at_zero_and_is_not_written():
    b = ArkBuilder()
    t = b.tensor((2, 3), strides=(2, 4), padded=(2, 4))
    full = b.tensor((2, 4), buffer=t.buffer)
    b.scalar_assign(t, 5.0); out = b.copy(full)
    ex = ArkExecutor(b.model()); ex.run()
    assert ex.get(out.id).tolist() == [[5, 5, 5, 0], [5, 5, 5, 0]]


def test_four_rank_all_reduce_by_send_recv():
    g = np.random.default_rng(3)
    vals = [g.standard_normal(5).astype(np.float32) for _ in range(4)]
    models, outs, ins = [], [], []
    for r in range(4):
        b = ArkBuilder(r, 4); x = b.tensor((5,)); ins.append(x)
        for q in range(4):
            if q != r: b.send(x, q, 100 * r + q)
        acc = x
        for q in range(4):
            if q != r: acc = b.add(acc, b.recv(b.tensor((5,)), q, 100 * q + r))
        models.append(b.model()); outs.append(acc)
    ex = ArkExecutor(models)
    for r in range(4): ex.set(ins[r].id, vals[r], r)
    ex.run()
    want = vals[0] + vals[1] + vals[2] + vals[3]
    for r in range(4): np.testing.assert_allclose(ex.get(outs[r].id, r), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('dtype', ['FP32', 'FP16', 'BF16'])
def test_tp_mlp_dtypes(dtype):
    g = np.random.default_rng(0)
    X, W1, W2 = (g.standard_normal(s).astype(np.float32) for s in ((4, 8), (16, 8), (8, 16)))
    parts = [tp_mlp(r) for r in (0, 1)]
    for m, _ in parts:
        for _, _, o in m.ops():
            for t in (*o.read, *o.write, *o.result): t.dtype = dtype
    ex = ArkExecutor([m for m, _ in parts])
    for r, (m, t) in enumerate(parts):
        ex.set(t['x'].id, X, r); ex.set(t['w1'].id, W1[8 * r:8 * r + 8], r); ex.set(t['w2'].id, W2[:, 8 * r:8 * r + 8], r)
    ex.run()
    ref = np.maximum(X @ W1.T, 0) @ W2.T
    tol = {'FP32': 1e-5, 'FP16': 2e-2, 'BF16': 1.5e-1}[dtype]
    for r, (m, t) in enumerate(parts): np.testing.assert_allclose(ex.get(t['out'].id, r), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize('seed', range(3))
def test_real_tutorial_graph_against_torch(seed):
    m = resize(read_ark(data_path('ark', 'tutorial_model_fe35541e_ops_external.json')), {4096: 24, 11008: 40, 512: 6})
    g = np.random.default_rng(seed)
    x, w1, w3, w2 = (g.standard_normal(s).astype(np.float16) * np.float16(c)
                     for s, c in (((1, 6, 24), 1), ((40, 24), 0.2), ((40, 24), 0.2), ((24, 40), 0.15)))
    ex = ArkExecutor(m)
    for tid, v in ((0, x), (1, w1), (3, w3), (2, w2)): ex.set(tid, v)
    ex.run()
    (_, out), = ex.outputs()
    X, W1, W3, W2 = (torch.from_numpy(v.astype(np.float32)) for v in (x, w1, w3, w2))
    ref = ((F.silu(X @ W1.T) * (X @ W3.T)) @ W2.T).numpy()
    got = ex.get(out)
    assert np.abs(got - ref).max() <= 5e-3 * np.abs(ref).max()


def test_errors():
    with pytest.raises(ArkExecError, match='no file of rank 1'): ArkExecutor([tp_mlp(0)[0]])
    b = ArkBuilder(); x = b.tensor((2,)); b.op('Frobnicate', [x], (2,))
    with pytest.raises(ArkExecError, match="op type 'Frobnicate' is not supported"): ArkExecutor(b.model()).run()
    b = ArkBuilder(); x = b.tensor((4,)); b.relu(x)
    ex = ArkExecutor(b.model())
    with pytest.raises(ArkExecError, match='does not fit tensor'): ex.set(x.id, np.zeros(3))
    with pytest.raises(ArkExecError, match='has no tensor 99'): ex.set(99, 1.0)
    def waits(r):
        b = ArkBuilder(r, 2); b.recv(b.tensor((2,)), 1 - r, 0); b.send(b.tensor((2,)), 1 - r, 0); return b.model()
    with pytest.raises(ArkExecError, match='deadlock'): ArkExecutor([waits(0), waits(1)]).run()


def test_cli_run_single_rank(tmp_path):
    b = ArkBuilder(); x = b.tensor((2, 3)); y = b.scalar_add(b.relu(x), 1.0)
    (tmp_path / 'm.json').write_text(ark_text(b.model()))
    np.save(tmp_path / 'x.npy', np.array([[-1, 2, -3], [4, -5, 6]], np.float32))
    rc, out, err = run_cli('ark', 'run', tmp_path / 'm.json', '--input', f'{x.id}={tmp_path / "x.npy"}', '--output', tmp_path / 'o.npz')
    assert rc == 0, err
    assert np.load(tmp_path / 'o.npz')[f't{y.id}'].tolist() == [[1, 3, 1], [5, 1, 7]]
    rc, out, err = run_cli('ark', 'run', tmp_path / 'm.json', '--input', 'nope=x.npy', '--output', tmp_path / 'o.npz')
    assert rc == 1 and "'nope' is not a tensor id" in err
