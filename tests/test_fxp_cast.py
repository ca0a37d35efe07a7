"""Cast oracles for nac_lab.fxp.types.

* exhaustive: every (rounding, overflow) pair on every raw value of a set of <= 8-bit source formats, against a
  small exact Python-int reference written here from the mode definitions (divmod + tie test, not the module's
  biased shifts);
* randomised: >= 100k values of 16/24/32/48-bit formats against apytypes (signed formats, the modes it has:
  all 7 roundings x WRAP/SAT) and against the reference for the rest (SAT_ZERO, SAT_SYM, WRAP_SM, unsigned);
* from_float against exact rational arithmetic (and apytypes' RND_INF/WRAP from_float).
"""
import itertools, math
import numpy as np
import pytest
from nac_lab.fxp.types import (QFormat, ROUNDING, OVERFLOW, cast, from_float, to_float, ModeError, RawRangeError,
                               RawTypeError, QFormatError)


def ref_round(n, s, mode):
    "n / 2**s rounded by `mode` (s <= 0: exact left shift)."
    if s <= 0: return n << -s
    q, r = divmod(n, 1 << s)
    half = 1 << (s - 1)
    if mode == 'TRN': return q
    if mode == 'TRN_ZERO': return q + (1 if r and n < 0 else 0)
    if r < half: return q
    if r > half: return q + 1
    return {'RND': q + 1, 'RND_ZERO': q + (n < 0), 'RND_INF': q + (n >= 0), 'RND_MIN_INF': q, 'RND_CONV': q + (q & 1)}[mode]


def ref_overflow(x, lead, fmt, mode):
    W, lo, hi = fmt.word_bits, fmt.min_raw, fmt.max_raw
    if mode == 'SAT_SYM' and fmt.signed:
        return hi if x > hi else -hi if x <= lo else x            # ruling fxp-1: the minimum code becomes -max
    if lo <= x <= hi: return x
    wrapped = (x - lo) % (1 << W) + lo
    if mode == 'WRAP': return wrapped
    if mode in ('SAT', 'SAT_SYM'): return max(lo, min(hi, x))
    if mode == 'SAT_ZERO': return 0
    assert mode == 'WRAP_SM'                                         # ruling fxp-2
    return -wrapped - 1 if ((lead >> W) & 1) != (wrapped < 0) else wrapped


def ref_cast(raw, src, dst, rmode, omode):
    s = src.frac_bits - dst.frac_bits
    return ref_overflow(ref_round(raw, s, rmode), ref_round(raw, s, 'TRN'), dst, omode)


SMALL_SRC = [QFormat(1, 1), QFormat(4, 2), QFormat(4, 4, False), QFormat(6, -1), QFormat(8, 4), QFormat(8, 8, False),
             QFormat(8, 10), QFormat(7, 0, False), QFormat(5, 5)]
SMALL_DST = [QFormat(4, 2), QFormat(3, 3, False), QFormat(8, 4), QFormat(6, 6), QFormat(5, -2), QFormat(10, 3, False),
             QFormat(2, 1), QFormat(1, 1), QFormat(9, 7)]


@pytest.mark.parametrize('src', SMALL_SRC, ids=str)
def test_exhaustive_small_formats(src):
    raws = np.arange(src.min_raw, src.max_raw + 1, dtype=np.int64)
    n = 0
    for dst, r, o in itertools.product(SMALL_DST, ROUNDING, OVERFLOW):
        if o == 'WRAP_SM' and not dst.signed:
            with pytest.raises(ModeError): cast(raws, src, dst, r, o)
            continue
        got = cast(raws, src, dst, r, o)
        want = [ref_cast(int(v), src, dst, r, o) for v in raws]
        assert got.tolist() == want, (str(src), str(dst), r, o)
        n += len(raws)
    n_unsigned = sum(not d.signed for d in SMALL_DST)
    assert n == len(raws) * len(ROUNDING) * (len(SMALL_DST) * len(OVERFLOW) - n_unsigned)


def _random_raws(fmt, n, rng):
    lo, hi = fmt.min_raw, fmt.max_raw
    v = rng.integers(lo, hi, n, endpoint=True, dtype=np.int64)
    edges = [lo, lo + 1, hi, hi - 1, 0, 1, -1 if fmt.signed else 2]
    v[:len(edges)] = edges
    k = n // 8                                                      # exact ties for shifts of 1..12 bits
    sh = rng.integers(1, 13, k)
    v[len(edges):len(edges) + k] = np.clip((v[len(edges):len(edges) + k] >> sh << sh) + (1 << (sh - 1)), lo, hi)
    return v


WIDE = [(QFormat(16, 5), [QFormat(8, 2), QFormat(12, 6), QFormat(20, 3), QFormat(10, 10)]),
        (QFormat(24, 12), [QFormat(16, 4), QFormat(8, 8), QFormat(30, 12), QFormat(13, 1)]),
        (QFormat(32, 8), [QFormat(16, 8), QFormat(24, 0), QFormat(12, 12), QFormat(40, 20)]),
        (QFormat(48, 20), [QFormat(32, 16), QFormat(24, 24), QFormat(16, -4), QFormat(60, 40)])]


@pytest.mark.parametrize('src,dsts', WIDE, ids=[str(s) for s, _ in WIDE])
def test_random_wide_against_apytypes(src, dsts):
    apy = pytest.importorskip('apytypes', reason='apytypes (a dev requirement) is not installed')
    Q, O = apy.QuantizationMode, apy.OverflowMode
    rng = np.random.default_rng(src.word_bits)
    raws = _random_raws(src, 100_000, rng)
    a = apy.APyFixedArray(raws, int_bits=src.int_bits, frac_bits=src.frac_bits)
    for dst, r, o in itertools.product(dsts, ROUNDING, ('WRAP', 'SAT')):
        b = a.cast(int_bits=dst.int_bits, frac_bits=dst.frac_bits, quantization=getattr(Q, r), overflow=getattr(O, o))
        bits = np.asarray(b.to_bits(numpy=True)).astype(np.uint64).astype(np.int64)
        want = np.where(bits >= (1 << (dst.word_bits - 1)), bits - (1 << dst.word_bits), bits)
        got = cast(raws, src, dst, r, o)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (str(src), str(dst), r, o, int(raws[bad[0]]), int(got[bad[0]]), int(want[bad[0]]))


@pytest.mark.parametrize('src,dsts', WIDE, ids=[str(s) for s, _ in WIDE])
def test_random_wide_other_modes_against_reference(src, dsts):
    rng = np.random.default_rng(src.word_bits + 1)
    raws = _random_raws(src, 100_000, rng)
    rmodes = rng.integers(0, len(ROUNDING), raws.size)
    for dst, o in itertools.product(dsts + [QFormat(dsts[0].word_bits, dsts[0].int_bits, False)], ('SAT_ZERO', 'SAT_SYM', 'WRAP_SM',
                                                                                                   'WRAP', 'SAT')):
        if o == 'WRAP_SM' and not dst.signed: continue
        for ri, r in enumerate(ROUNDING):
            sel = raws[rmodes == ri][:2000] if o in ('WRAP', 'SAT') and dst.signed else raws[rmodes == ri]
            got = cast(sel, src, dst, r, o)
            want = [ref_cast(int(v), src, dst, r, o) for v in sel[::5]]
            assert got[::5].tolist() == want, (str(src), str(dst), r, o)


def test_wide_words_are_exact_python_ints():
    src, dst = QFormat(100, 40), QFormat(70, 10)
    rng = np.random.default_rng(5)
    raws = np.array([int(rng.integers(0, 2**62)) * 2**37 - 2**98 + int(rng.integers(0, 2**30)) for _ in range(3000)], dtype=object)
    for r, o in itertools.product(ROUNDING, OVERFLOW):
        got = cast(raws, src, dst, r, o)
        assert got.dtype == object
        assert got.tolist() == [ref_cast(v, src, dst, r, o) for v in raws], (r, o)
    assert cast(raws, src, QFormat(40, 10), 'RND', 'SAT').dtype == np.int64


def ref_from_float(v, fmt, r, o):
    num, den = float(v).as_integer_ratio()                 # den is a power of two
    s = den.bit_length() - 1 - fmt.frac_bits
    n = num if s >= 0 else num << -s
    return ref_overflow(ref_round(n, max(s, 0), r), ref_round(n, max(s, 0), 'TRN'), fmt, o)


def test_from_float_against_exact_rationals():
    rng = np.random.default_rng(11)
    vals = np.concatenate([rng.normal(0, 10, 4000), rng.normal(0, 1e-3, 1000), rng.uniform(-1e6, 1e6, 1000),
                           np.arange(-64, 64) / 8 + 1 / 16, [0.0, -0.0, 1e300, -1e300, 5e-324, -5e-324, 2.0**70 + 2.0**20]])
    for fmt in (QFormat(8, 4), QFormat(16, 3), QFormat(12, 12, False), QFormat(32, 16), QFormat(62, 30), QFormat(80, 40), QFormat(6, -3)):
        for r, o in itertools.product(ROUNDING, OVERFLOW):
            if o == 'WRAP_SM' and not fmt.signed: continue
            got = from_float(vals, fmt, r, o)
            want = [ref_from_float(v, fmt, r, o) for v in vals[::3]]
            assert got[::3].tolist() == want, (str(fmt), r, o)


def test_from_float_matches_apytypes_default():
    apy = pytest.importorskip('apytypes', reason='apytypes (a dev requirement) is not installed')
    rng = np.random.default_rng(12)
    vals = np.concatenate([rng.normal(0, 100, 20000), np.arange(-200, 200) / 4 + 1 / 8])
    for fmt in (QFormat(16, 8), QFormat(24, 4), QFormat(10, 10)):
        b = apy.APyFixedArray.from_float(vals, int_bits=fmt.int_bits, frac_bits=fmt.frac_bits)
        bits = np.asarray(b.to_bits(numpy=True)).astype(np.int64)
        want = np.where(bits >= (1 << (fmt.word_bits - 1)), bits - (1 << fmt.word_bits), bits)
        assert from_float(vals, fmt, 'RND_INF', 'WRAP').tolist() == want.tolist()


def test_to_float_roundtrip_and_errors():
    f = QFormat(20, 7)
    raws = np.arange(f.min_raw, f.max_raw + 1, 997)
    assert from_float(to_float(raws, f), f).tolist() == raws.tolist()
    with pytest.raises(RawTypeError): cast(np.array([1.5]), f, f)
    with pytest.raises(RawRangeError, match='index'): cast([f.max_raw + 1], f, f)
    with pytest.raises(RawRangeError, match='NaN'): from_float([np.nan], f)
    with pytest.raises(ModeError, match='unknown overflow'): cast([1], f, f, overflow='CLAMP')
    with pytest.raises(QFormatError): QFormat(-3, 2)


def test_to_float_rounding_modes():
    rng = np.random.default_rng(13)
    for fmt in (QFormat(62, 10), QFormat(120, 60), QFormat(8, 4)):
        raws = [fmt.min_raw, fmt.max_raw, 0, 1,
                -1] + [int(rng.integers(0, 2**62)) * (fmt.max_raw - fmt.min_raw) // 2**62 + fmt.min_raw for _ in range(3000)]
        raws += [((1 << 53) + 1) << 3, -(((1 << 53) + 1) << 3), (1 << 54) + 2, -((1 << 54) + 2)]     # ties at 53 bits
        raws = [v for v in raws if fmt.min_raw <= v <= fmt.max_raw]
        arr = np.array(raws, dtype=fmt.dtype)
        for r in ROUNDING:
            got = to_float(arr, fmt, r)
            want = []
            for v in raws:
                sh = max(abs(v).bit_length() - 53, 0)
                want.append(math.ldexp(float(ref_round(v, sh, r)), sh - fmt.frac_bits))
            assert got.tolist() == want, (str(fmt), r)
        if not fmt.wide:   # the default is numpy's own nearest-even conversion
            assert to_float(arr, fmt).tolist() == np.ldexp(arr.astype(np.float64), -fmt.frac_bits).tolist()
