"""An integer reference for TFLite/gemmlowp requantization, written from the definitions (TFLite `QuantizeMultiplier`,
gemmlowp `SaturatingRoundingDoublingHighMul` and `RoundingDivideByPOT`) with exact rational and plain integer arithmetic,
sharing no code with `nac_lab.fxp`. The lowering tests compute their expected int8 values with it (issue #28 item 7): the
program under test requantizes with `nac_lab.fxp`, the expectation must not."""
import math
from contextlib import contextmanager
from fractions import Fraction
from unittest import mock
import numpy as np

INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1

def quantize_multiplier(M) -> tuple:
    """TFLite `QuantizeMultiplier` for a non-negative real `M`: `M = q * 2**shift` with `q` in [1/2, 1), `m0 = round(q * 2**31)`
    (std::round: half away from zero), `m0 == 2**31` renormalised; shifts below -31 flush to (0, 0), above 30 saturate."""
    f = Fraction(float(M))                   # the exact value of the double
    if f < 0: raise ValueError('requantization multipliers are products of scales: never negative')
    if f == 0: return 0, 0
    q, shift = f, 0
    while q >= 1: q /= 2; shift += 1
    while q < Fraction(1, 2): q *= 2; shift -= 1
    m0 = math.floor(q * 2 ** 31 + Fraction(1, 2))
    if m0 == 2 ** 31: m0, shift = 2 ** 30, shift + 1
    if shift < -31: return 0, 0
    if shift > 30: return INT32_MAX, 30
    return m0, shift

def _c_div(a, d: int):
    "C integer division (truncation toward zero) of int64 array `a` by the positive `d`."
    return np.where(a >= 0, a // d, -((-a) // d))

def srdhm(a, b):
    "gemmlowp SaturatingRoundingDoublingHighMul: (a*b + nudge) / 2**31 in C arithmetic; nudge 2**30, or 1 - 2**30 when a*b < 0."
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ab = a * b                                               # |a|, |b| <= 2**31: exact in int64
    high = _c_div(ab + np.where(ab >= 0, 2 ** 30, 1 - 2 ** 30), 2 ** 31)
    return np.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, high)

def rounding_divide_by_pot(x, exponent):
    "gemmlowp RoundingDivideByPOT: x / 2**exponent rounded half away from zero (arithmetic shift plus a remainder test)."
    x, e = np.asarray(x, np.int64), np.asarray(exponent, np.int64)
    mask = (np.int64(1) << e) - 1
    threshold = (mask >> 1) + (x < 0)
    return (x >> e) + ((x & mask) > threshold)

def requantize(acc, multiplier, zero_point=0, out=None, rounding: str = 'double'):
    """TFLite `MultiplyByQuantizedMultiplier(acc, m0, shift) + zero_point`, clamped to `out`'s raw range (int8 by default);
    `multiplier` is a scalar or one per channel along the last axis."""
    if rounding != 'double': raise NotImplementedError('only the double-rounding (TFLite reference) path is written here')
    acc = np.asarray(acc, np.int64)
    assert ((acc >= INT32_MIN) & (acc <= INT32_MAX)).all(), 'accumulators are int32'
    pairs = [quantize_multiplier(m) for m in np.atleast_1d(np.asarray(multiplier, np.float64)).reshape(-1)]
    m0 = np.array([p[0] for p in pairs], np.int64); shift = np.array([p[1] for p in pairs], np.int64)
    left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
    x = acc * (np.int64(1) << left)
    assert ((x >= INT32_MIN) & (x <= INT32_MAX)).all(), 'x * 2**left_shift overflows int32 (undefined in TFLite)'
    y = rounding_divide_by_pot(srdhm(x, m0), right) + np.asarray(zero_point, np.int64)
    lo, hi = (-128, 127) if out is None else (out.min_raw, out.max_raw)
    return np.clip(y, lo, hi).reshape(acc.shape)

@contextmanager
def independent_requantization():
    "Within the block, lowering's reference (`nac_lab.lower.reference.reference_int8`) requantizes with this module, not `nac_lab.fxp`."
    import nac_lab.lower.reference as q
    with mock.patch.object(q, 'requantize', requantize): yield

def reference_int8(*args, **kw) -> dict:
    "`nac_lab.lower.reference.reference_int8` (whole-tensor layer walk) with the requantization of this module."
    from nac_lab.lower.reference import reference_int8 as walk
    with independent_requantization(): return walk(*args, **kw)
