"""MAC-array oracle: mac_matmul / mac_matmul_tree against scalar Python loops that add in k order (or pairwise)
with the overflow mode after every addition."""
import numpy as np
import pytest
from nac_lab.fxp.types import QFormat, FxpError
from nac_lab.fxp.ops import mac_matmul, mac_matmul_tree


def fix(v, W, mode):
    lo, hi = -(1 << (W - 1)), (1 << (W - 1)) - 1
    if lo <= v <= hi: return v, 0
    return (max(lo, min(hi, v)) if mode == 'SAT' else (v - lo) % (1 << W) + lo), 1


def ref_seq(a, b, W, mode):
    M, K = a.shape; N = b.shape[1]
    out = [[0] * N for _ in range(M)]; ev = [[0] * N for _ in range(M)]
    for i in range(M):
        for j in range(N):
            s = e = 0
            for k in range(K):
                p, e1 = fix(int(a[i, k]) * int(b[k, j]), W, mode)
                s, e2 = fix(s + p, W, mode); e += e1 + e2
            out[i][j], ev[i][j] = s, e
    return out, ev


def ref_tree(a, b, W, mode):
    M, K = a.shape; N = b.shape[1]
    out = [[0] * N for _ in range(M)]
    for i in range(M):
        for j in range(N):
            lvl = [fix(int(a[i, k]) * int(b[k, j]), W, mode)[0] for k in range(K)]
            while len(lvl) > 1:
                nxt = [fix(lvl[t] + lvl[t + 1], W, mode)[0] for t in range(0, len(lvl) - 1, 2)]
                lvl = nxt + ([lvl[-1]] if len(lvl) % 2 else [])
            out[i][j] = lvl[0] if lvl else 0
    return out


@pytest.mark.parametrize('mode', ['WRAP', 'SAT'])
@pytest.mark.parametrize('W,bits', [(12, 8), (16, 8), (20, 8), (24, 12), (9, 4), (32, 16)])
def test_mac_matches_scalar_reference(mode, W, bits):
    rng = np.random.default_rng(W * 100 + bits + (mode == 'SAT'))
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    for M, K, N in ((3, 17, 4), (1, 1, 1), (4, 64, 2), (2, 0, 3)):
        a = rng.integers(lo, hi, (M, K), endpoint=True); b = rng.integers(lo, hi, (K, N), endpoint=True)
        if K > 4: a[0, :] = lo; b[:, 0] = lo                          # extreme rows/columns: worst-case sums
        want, wev = ref_seq(a, b, W, mode)
        got, gev = mac_matmul(a, b, QFormat(W, W), mode, events=True)
        assert got.tolist() == want and gev.tolist() == wev, (M, K, N)
        assert mac_matmul(a, b, QFormat(W, W), mode).tolist() == want
        assert mac_matmul_tree(a, b, QFormat(W, W), mode).tolist() == ref_tree(a, b, W, mode)


def test_order_dependence_of_saturation():
    a = np.array([[127] * 8 + [-128] * 8]); b = np.full((16, 1), 127)
    sat = mac_matmul(a, b, QFormat(16, 16), 'SAT')[0, 0]
    rev = mac_matmul(a[:, ::-1], b[::-1], QFormat(16, 16), 'SAT')[0, 0]
    assert (sat, rev) == (ref_seq(a, b, 16, 'SAT')[0][0][0], ref_seq(a[:, ::-1], b[::-1], 16, 'SAT')[0][0][0])
    assert sat != rev


def test_mac_errors():
    with pytest.raises(FxpError, match='integer array'): mac_matmul(np.ones((2, 2)), np.ones((2, 2), int), QFormat(16, 16))
    with pytest.raises(FxpError, match='62 bits'): mac_matmul(np.array([[2**40]]), np.array([[2**40]]), QFormat(32, 32))
    with pytest.raises(FxpError, match='wider than 62'): mac_matmul(np.ones((1, 1), int), np.ones((1, 1), int), QFormat(64, 64))


def test_datapath_by_tile_equals_vectorised_and_reference():
    from nac_lab.fxp.mac import Datapath
    from nac_lab.fxp.requant import requantize
    rng = np.random.default_rng(21)
    x = rng.integers(-128, 128, (11, 50)); w = rng.integers(-128, 128, (50, 7)); b = rng.integers(-2**31, 2**31, 7)
    Ms = rng.uniform(1e-5, 1e-2, 7)
    for acc, ovf in ((QFormat(16, 16), 'SAT'), (QFormat(18, 18), 'WRAP'), (QFormat(32, 32), 'SAT')):
        dp = Datapath(rows=4, cols=3, acc=acc, overflow=ovf, x_zero=5, w_zero=-7, multiplier=Ms, out_zero=3, act_min=3)
        r, rt = dp.run(x, w, b), dp.run(x, w, b, by_tile=True)
        assert (r.y == rt.y).all() and (r.acc == rt.acc).all() and (r.events == rt.events).all() and r.tile_events == rt.tile_events
        # reference: scalar k-order accumulation, the bias as one more accumulator addition, then requantize + clamp
        s, ev = ref_seq(x + -5, w + 7, acc.word_bits, ovf)
        s = np.array(s); ev = np.array(ev)
        bb = np.array([fix(int(v), acc.word_bits, ovf)[0] for v in b]); ev += np.array([fix(int(v), acc.word_bits, ovf)[1] for v in b])
        t = np.array([[fix(int(s[i, j] + bb[j]), acc.word_bits, ovf)[0] for j in range(7)] for i in range(11)])
        ev += np.array([[fix(int(s[i, j] + bb[j]), acc.word_bits, ovf)[1] for j in range(7)] for i in range(11)])
        assert (r.acc == t).all() and (r.events == ev).all()
        assert (r.y == np.clip(requantize(t, Ms, 3), 3, 127)).all()
        assert r.cycles == 3 * 3 * 50 + 1 and r.tiles == 9
