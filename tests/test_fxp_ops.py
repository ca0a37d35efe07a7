"""Full-precision arithmetic: fx_add/fx_sub/fx_mul/fx_neg/fx_shift against exact rationals (fractions.Fraction),
on int64 and on wide (Python-int object) formats; the result formats hold every result exactly."""
import itertools
from fractions import Fraction
import numpy as np
import pytest
from nac_lab.fxp.types import QFormat, RawRangeError
from nac_lab.fxp.ops import fx_add, fx_sub, fx_mul, fx_neg, fx_shift, add_format, mul_format

FORMATS = [QFormat(8, 4), QFormat(6, 6, False), QFormat(5, -2), QFormat(12, 15), QFormat(40, 20), QFormat(70, 35),
           QFormat(33, 1, False), QFormat(1, 1)]


def val(raw, f): return Fraction(int(raw), 1) * Fraction(2) ** (-f.frac_bits)


def sample(f, rng, n=60):
    lo, hi = f.min_raw, f.max_raw
    v = [lo, hi, 0, min(hi, 1), max(lo, -1)] + [int(rng.integers(0, 2**62)) * (hi - lo) // 2**62 + lo for _ in range(n)]
    return np.array(v, dtype=f.dtype)


@pytest.mark.parametrize('fa,fb', list(itertools.product(FORMATS, FORMATS)), ids=str)
def test_arithmetic_is_exact(fa, fb):
    rng = np.random.default_rng(fa.word_bits * 131 + fb.word_bits)
    a, b = sample(fa, rng), sample(fb, rng)[::-1][:len(sample(fa, rng))]
    b = np.resize(b, a.shape).astype(fb.dtype)
    for op, fn, ref in (('+', fx_add, lambda x, y: x + y), ('-', fx_sub, lambda x, y: x - y), ('*', fx_mul, lambda x, y: x * y)):
        r, f = fn(a, fa, b, fb)
        assert f == (mul_format(fa, fb) if op == '*' else add_format(fa, fb, op == '-'))
        assert r.dtype == f.dtype
        want = [ref(val(x, fa), val(y, fb)) for x, y in zip(a, b)]
        assert [val(v, f) for v in r] == want, (op, str(fa), str(fb))
        assert all(f.min_raw <= int(v) <= f.max_raw for v in r)            # the full-precision format holds it
    r, f = fx_neg(a, fa)
    assert [val(v, f) for v in r] == [-val(x, fa) for x in a] and all(f.min_raw <= int(v) <= f.max_raw for v in r)
    r, f = fx_shift(a, fa, -5)
    assert [val(v, f) for v in r] == [val(x, fa) / 32 for x in a]


def test_inputs_are_checked():
    with pytest.raises(RawRangeError): fx_add([128], QFormat(8, 4), [0], QFormat(8, 4))
