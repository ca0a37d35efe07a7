"The independent requantization of tests/int_reference.py on values derived by hand from the TFLite/gemmlowp definitions."
import numpy as np, pytest
from int_reference import quantize_multiplier, srdhm, rounding_divide_by_pot, requantize, INT32_MIN, INT32_MAX

def test_quantize_multiplier_by_hand():
    assert quantize_multiplier(0.5) == (2 ** 30, 0)            # 0.5 = 0.5 * 2**0
    assert quantize_multiplier(0.25) == (2 ** 30, -1)          # 0.25 = 0.5 * 2**-1
    assert quantize_multiplier(0.75) == (3 * 2 ** 29, 0)       # 0.75 * 2**31
    assert quantize_multiplier(1.0) == (2 ** 30, 1)            # 1 = 0.5 * 2**1
    assert quantize_multiplier(0.0) == (0, 0)
    assert quantize_multiplier(2.0 ** -40) == (0, 0)           # shift -39 < -31: flushed
    assert quantize_multiplier(2.0 ** 40) == (INT32_MAX, 30)   # shift 41 > 30: saturated
    # 1 - 2**-33 = q with q * 2**31 = 2**31 - 1/4: rounds to 2**31 - 0 -> renormalised to (2**30, 1)
    assert quantize_multiplier(1 - 2.0 ** -33) == (2 ** 30, 1)
    # (2**31 - 1) / 2**31 + 2**-33 -> q * 2**31 = 2**31 - 3/4: rounds to 2**31 - 1
    assert quantize_multiplier((2 ** 31 - 1) / 2 ** 31 + 2.0 ** -34) == (2 ** 31 - 1, 0)
    with pytest.raises(ValueError): quantize_multiplier(-0.5)

def test_srdhm_by_hand():
    # a*b = 3 * 2**30: (3 * 2**30 + 2**30) / 2**31 = 2 exactly
    assert srdhm(3, 2 ** 30) == 2
    # a*b = -3 * 2**30: (-3 * 2**30 + 1 - 2**30) / 2**31 = -(2**32 - 1) / 2**31 = -1.99.. -> truncated to -1
    assert srdhm(-3, 2 ** 30) == -1
    assert srdhm(INT32_MIN, INT32_MIN) == INT32_MAX            # the one saturating case
    assert srdhm(INT32_MAX, INT32_MAX) == INT32_MAX - 1         # (2**62 - 2**32 + 1 + 2**30) // 2**31 = 2**31 - 2

def test_rounding_divide_by_pot_by_hand():
    assert rounding_divide_by_pot(5, 1) == 3 and rounding_divide_by_pot(-5, 1) == -3     # 2.5 -> 3, -2.5 -> -3: away from zero
    assert rounding_divide_by_pot(7, 2) == 2 and rounding_divide_by_pot(-7, 2) == -2     # 1.75 -> 2
    assert rounding_divide_by_pot(6, 2) == 2 and rounding_divide_by_pot(-6, 2) == -2     # 1.5 -> 2, -1.5 -> -2
    assert rounding_divide_by_pot(5, 2) == 1 and rounding_divide_by_pot(-5, 2) == -1     # 1.25 -> 1
    assert rounding_divide_by_pot(123, 0) == 123

def test_requantize_by_hand():
    # M = 0.25 -> (2**30, -1): srdhm(100, 2**30) = (100 + 1) * 2**30 // 2**31 = 50, then 50 / 2 = 25; + zero point 3
    assert requantize(100, 0.25, 3).tolist() == 28
    # -7 * 0.25 = -1.75: srdhm(-7, 2**30) = -3 (truncated -3.99..), then -3 / 2 = -1.5 -> -2
    assert requantize(-7, 0.25).tolist() == -2
    assert requantize([1000, -1000], 0.5).tolist() == [127, -128]           # clamped to int8
    # per channel along the last axis, 0.5 and 0.25: 10 * 0.5 = 5; 10 * 0.25: srdhm = (10 + 1) * 2**30 // 2**31 = 5, 5 / 2 = 2.5 -> 3;
    # -10 * 0.5 = -5; -10 * 0.25: srdhm = -(11 * 2**30 - 1) / 2**31 -> -5 (truncated), -5 / 2 = -2.5 -> -3 (away from zero)
    assert requantize([[10, 10], [-10, -10]], np.array([0.5, 0.25])).tolist() == [[5, 3], [-5, -3]]

def test_agrees_with_nac_lab_fxp_on_random_values():
    "A cross-check of two independent implementations (neither is the expectation of the other in the lowering tests)."
    from nac_lab.fxp.requant import requantize as fxp_requantize
    rng = np.random.default_rng(0)
    acc = rng.integers(INT32_MIN, INT32_MAX, 20000, endpoint=True)
    for M in (0.5, 0.013, 3.7e-5, 0.9999999, 1.7, 12.0 / 1024):
        small = acc >> int(max(0, np.ceil(np.log2(M)) + 1)) if M >= 1 else acc
        assert np.array_equal(requantize(small, M, -3), fxp_requantize(small, M, -3))
