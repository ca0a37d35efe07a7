"""Requantization oracle: nac_lab.fxp.requant against scalar Python-int references written from the published
algorithms (TFLite QuantizeMultiplier, gemmlowp SaturatingRoundingDoublingHighMul + RoundingDivideByPOT, TFLite
single rounding), including INT32_MIN × INT32_MIN and exact ties."""
import math
from fractions import Fraction
import numpy as np
import pytest
from nac_lab.fxp.types import QFormat, FxpError, RawRangeError
from nac_lab.fxp.requant import quantize_multiplier, requantize, srdhm, rdbpot, mbqm_double

I32MIN, I32MAX = -2**31, 2**31 - 1


def ref_qm(M):
    if M == 0: return 0, 0
    q, e = math.frexp(M)
    x = abs(Fraction(q)) * 2**31
    m = int(x) + (1 if x - int(x) >= Fraction(1, 2) else 0)      # half away from zero, on the magnitude
    m = m if q > 0 else -m
    if m == 2**31: m, e = 2**30, e + 1
    if e < -31: return 0, 0
    if e > 30: return (I32MAX, 30) if M > 0 else (I32MIN, 30)
    return m, e


def ref_srdhm(a, b):
    if a == b == I32MIN: return I32MAX
    ab = a * b
    t = ab + (2**30 if ab >= 0 else 1 - 2**30)
    q = abs(t) // 2**31
    return q if t >= 0 else -q                                    # C++ division truncates toward zero


def ref_rdbpot(x, e):
    mask = (1 << e) - 1
    return (x >> e) + (1 if (x & mask) > (mask >> 1) + (1 if x < 0 else 0) else 0)


def wrap32(v): return (v + 2**31) % 2**32 - 2**31


def ref_double(x, m0, sh): return ref_rdbpot(ref_srdhm(wrap32(x << max(sh, 0)), m0), max(-sh, 0))
def ref_single(x, m0, sh): return max(I32MIN, min(I32MAX, (x * m0 + (1 << (30 - sh))) >> (31 - sh)))


def test_quantize_multiplier_matches_reference():
    rng = np.random.default_rng(1)
    Ms = list(np.exp(rng.uniform(-30, 12, 5000))) + [2.0**k for k in range(-40, 40)] + [0.0, 1e-12, 3e9, -0.3, -2.0**-31]
    Ms += [0.5 + 2**-32, 1 - 2**-33, 1 - 2**-32, 0.5 + 3 * 2**-33]   # exact ties and the round-up-to-2^31 case
    for M in Ms: assert quantize_multiplier(float(M)) == ref_qm(float(M)), M


def test_srdhm_rdbpot_edges():
    vals = [I32MIN, I32MIN + 1, -2**30, -3, -1, 0, 1, 3, 2**30, I32MAX]
    a = np.array([x for x in vals for _ in vals]); b = np.array([y for _ in vals for y in vals])
    assert srdhm(a, b).tolist() == [ref_srdhm(int(x), int(y)) for x, y in zip(a, b)]
    assert srdhm(np.array([I32MIN]), np.array([I32MIN]))[0] == I32MAX
    xs = np.array(vals + [5, -5, 6, -6, 7, -7, 2**31 - 2, -(2**31) + 2])
    for e in range(32):
        assert rdbpot(xs, e).tolist() == [ref_rdbpot(int(x), e) for x in xs], e


@pytest.mark.parametrize('rounding', ['double', 'single'])
def test_requantize_random_matches_reference(rounding):
    rng = np.random.default_rng(7 if rounding == 'double' else 8)
    n = 20000
    acc = np.concatenate([rng.integers(I32MIN, I32MAX, n, endpoint=True), rng.integers(-70000, 70000, n),
                          [I32MIN, I32MAX, 0, -1, 1] * 4])
    mults = [float(m) for m in np.exp(rng.uniform(-25, 3, 6))] + [0.5, 1.0, 2.0**-31, 1.5]
    for M in mults:
        m0, sh = quantize_multiplier(M)
        for zp, out in ((0, QFormat(8, 8)), (-128, QFormat(8, 8)), (17, QFormat(8, 8, False)), (5, QFormat(16, 16))):
            got = requantize(acc, M, zp, out, rounding)
            f = ref_double if rounding == 'double' else ref_single
            want = [min(out.max_raw, max(out.min_raw, f(int(x), m0, sh) + zp)) for x in acc[::7]]
            assert got[::7].tolist() == want, (M, zp, out)


def test_requantize_ties_and_int32_min():
    # M = 2^-k exactly: acc·M has exact ties at odd multiples of 2^(k-1)
    for k in range(1, 8):
        acc = np.arange(-300, 301)
        d = requantize(acc, 2.0**-k, 0, QFormat(32, 32), 'double')
        s = requantize(acc, 2.0**-k, 0, QFormat(32, 32), 'single')
        exact = [Fraction(int(x), 2**k) for x in acc]
        if k == 1:   # M = 1/2 is m0 = 2^30, shift 0: the tie is decided by SRDHM, which rounds it toward +inf
            assert d.tolist() == [math.floor(v + Fraction(1, 2)) for v in exact]
        else:        # at exact ties x is even, SRDHM halves exactly and RoundingDivideByPOT rounds away from zero
            ties = [i for i, v in enumerate(exact) if v.denominator == 2]
            assert [int(d[i]) for i in ties] == [math.floor(abs(exact[i]) + Fraction(1, 2)) * (1 if exact[i] >= 0 else -1) for i in ties]
            assert d.tolist() == [ref_double(int(x), 2**30, 1 - k) for x in acc]
        if k == 2: assert d[acc == 1][0] == 1   # 0.25: SRDHM rounds 0.5 up, then 0.5 again: double rounding gives 1
        assert s.tolist() == [math.floor(v + Fraction(1, 2)) for v in exact]                                 # toward +inf
    # negative multiplier −0.5 → m0 = INT32_MIN·(−1)… the INT32_MIN × INT32_MIN product saturates
    assert mbqm_double(np.array([I32MIN]), np.array([I32MIN]), 0)[0] == I32MAX
    assert requantize([I32MIN], (I32MIN, 0), 0, QFormat(32, 32))[0] == I32MAX
    assert requantize([I32MIN], (I32MIN, 0), 0, QFormat(32, 32))[0] == ref_double(I32MIN, I32MIN, 0)


def test_per_channel_and_precomputed():
    rng = np.random.default_rng(3)
    acc = rng.integers(-2**20, 2**20, (64, 5))
    Ms = np.array([0.001, 0.01, 0.3, 1.7, 2.0**-20])
    got = requantize(acc, Ms, 3)
    for c, M in enumerate(Ms):
        assert got[:, c].tolist() == requantize(acc[:, c], float(M), 3).tolist()
    pairs = [quantize_multiplier(float(M)) for M in Ms]
    pre = requantize(acc, (np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])), 3)
    assert pre.tolist() == got.tolist()


def test_requantize_errors():
    with pytest.raises(RawRangeError): requantize([2**31], 0.5)
    with pytest.raises(FxpError, match='shift must be in'): requantize([1], (2**30, 31))
    with pytest.raises(FxpError, match='one-dimensional'): requantize([[1]], np.ones((1, 1)))
    with pytest.raises(FxpError, match='finite'): requantize([1], float('inf'))
