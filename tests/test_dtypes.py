"""nac_lab.dtypes: every format's code map goes through the shared records, and the one bfloat16 pair against torch."""
import numpy as np
import pytest
import torch
from nac_lab.dtypes import ELEM_TYPES, elem_type, elem_type_of, f32_to_bf16_bits, bf16_bits_to_f32, bf16_round
from nac_lab.safetensors import SAFETENSORS_DTYPES, ST_DTYPES, ST_SIZES, RAW_DTYPES
from nac_lab.nac.format.container import DType, DTYPE_NAMES, DTYPE_NP
from nac_lab.nac.format.writer import SAFETENSORS_TO_NAC, NAC_TO_SAFETENSORS
from nac_lab.nem.execution.memory import NEM_ELEM_TYPES, STORE_DTYPE
from nac_lab.irv2.build import IRV2_DTYPES, DTYPES as IRV2_SIZES
from nac_lab.ark.format import DTYPES as ARK_STORAGE
from nac_lab.lower.emit import DTYPE as LOWER_DTYPE, ESIZE

# Sizes as each format's own document states them (written out here, not derived from the records).
SAFETENSORS_BYTES = dict(F64=8, F32=4, F16=2, BF16=2, F8_E4M3=1, F8_E5M2=1, I64=8, I32=4, I16=2, I8=1, U64=8, U32=4, U16=2,
                         U8=1, BOOL=1)
NAC_BYTES = {DType.F32: 4, DType.F64: 8, DType.F16: 2, DType.BF16: 2, DType.I32: 4, DType.I64: 8, DType.I16: 2, DType.I8: 1,
             DType.U8: 1, DType.BOOL: 1}


@pytest.mark.parametrize('fmt,codes,sizes', [('safetensors', SAFETENSORS_DTYPES, SAFETENSORS_BYTES),
                                             ('NAC', DTYPE_NAMES, NAC_BYTES),
                                             ('IR v2', IRV2_DTYPES, dict(fp32=4, bf16=2, fp16=2, i32=4))])
def test_code_map_round_trips(fmt, codes, sizes):
    "format code -> record -> code is the identity, and the record's size is the one the format states."
    inverse = {v: k for k, v in codes.items()}
    assert len(inverse) == len(codes), f'{fmt}: two codes name one element type'
    for code, name in codes.items():
        rec = elem_type(name)
        assert rec.name == name and inverse[rec.name] == code
        assert rec.size == sizes[code], (fmt, code)


def test_derived_tables_agree_with_records():
    assert set(ST_DTYPES) == set(SAFETENSORS_DTYPES) and ST_SIZES == SAFETENSORS_BYTES
    assert RAW_DTYPES == {'BF16', 'F8_E4M3', 'F8_E5M2'}
    assert {d: DTYPE_NP[d].itemsize for d in DType} == NAC_BYTES
    assert DTYPE_NP[DType.BF16] == np.dtype('<u2')
    # NAC <-> safetensors through the canonical names: every NAC type has a safetensors code
    assert set(NAC_TO_SAFETENSORS) == set(DType)
    assert all(SAFETENSORS_TO_NAC[NAC_TO_SAFETENSORS[d]] == d for d in DType)
    assert NAC_TO_SAFETENSORS[DType.BF16] == 'BF16' and NAC_TO_SAFETENSORS[DType.U8] == 'U8'
    assert IRV2_SIZES == dict(fp32=4, bf16=2, fp16=2, i32=4)
    # NEM: stored bytes per element (nem_spec: i8/u8 one byte, i16/u16/f16/bf16 two, i32/u32/f32 four)
    assert {k: v.itemsize for k, v in STORE_DTYPE.items()} == dict(i8=1, u8=1, i16=2, u16=2, i32=4, u32=4, f16=2, bf16=2, f32=4)
    assert NEM_ELEM_TYPES['i4'] == 'int4' and elem_type('int4').bits == 4
    assert all(NEM_ELEM_TYPES[k] == v for k, v in LOWER_DTYPE.items()) and ESIZE == dict(i8=1, i32=4, f32=4, bf16=2, f16=2)


def test_ark_storage_matches_records():
    "ARK's table keeps numpy storage types: each is the storage of the record its name denotes."
    ark_names = dict(FP32='float32', FP16='float16', BF16='bfloat16', INT32='int32', UINT32='uint32')
    for code, name in ark_names.items():
        assert np.dtype(ARK_STORAGE[code]).str == elem_type(name).storage.str, code


def test_every_record_is_consistent():
    for r in ELEM_TYPES.values():
        assert r.size * 8 >= r.bits
        if not r.raw and r.name != 'int4' and r.kind != 'bool':
            assert elem_type_of(r.storage) is r
            assert str(getattr(torch, r.name)) == f'torch.{r.name}'


def _torch_bits(f32: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(f32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def _patterns() -> np.ndarray:
    "About 1.2 million float32 bit patterns: a seeded uniform sample plus every hard class, written out."
    rng = np.random.default_rng(20261127)
    sample = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    hi = rng.integers(0, 2**16, 50_000, dtype=np.uint64).astype(np.uint32) << 16
    ties = np.concatenate([hi | 0x8000, hi | 0x7FFF, hi | 0x8001])            # exact ties, one below, one above
    sub = rng.integers(1, 2**23, 50_000, dtype=np.uint64).astype(np.uint32)    # subnormals of both signs
    subs = np.concatenate([sub, sub | 0x80000000])
    nan_payload = rng.integers(1, 2**23, 20_000, dtype=np.uint64).astype(np.uint32)
    nans = np.concatenate([0x7F800000 | nan_payload, 0xFF800000 | nan_payload,
                           np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF], np.uint32)])
    near_max = (np.uint32(0x7F7F0000) + np.arange(0x10000, dtype=np.uint32))   # the last binade's top: some round to inf
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x00000001, 0x807FFFFF], np.uint32)
    return np.concatenate([sample, ties, subs, nans, near_max, near_max | 0x80000000, special])


def test_bf16_rounding_bit_exact_with_torch():
    u = _patterns()
    assert u.size >= 10**6
    f = u.view(np.float32)
    ours, theirs = f32_to_bf16_bits(f), _torch_bits(f)
    nan = np.isnan(f)
    assert nan.sum() > 40_000 and (~nan).sum() > 10**6
    bad = np.flatnonzero((ours != theirs) & ~nan)
    assert bad.size == 0, [(hex(u[i]), hex(ours[i]), hex(theirs[i])) for i in bad[:5]]
    # the NaN policy: quiet NaN 0x7FC0 with the input's sign, whatever the payload
    assert np.all(ours[nan] == np.where(u[nan] >> 31 == 1, 0xFFC0, 0x7FC0))
    # values above the largest bf16 by half an ulp or more become infinities, with their sign
    assert f32_to_bf16_bits(np.array([0x7F7F8000, 0xFF7F8000], np.uint32).view(np.float32)).tolist() == [0x7F80, 0xFF80]


def test_bf16_widening_exact_on_every_pattern():
    b = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
    w = bf16_bits_to_f32(b)
    assert np.array_equal(w.view(np.uint32), b.astype(np.uint32) << 16)          # payloads and signs kept
    theirs = torch.from_numpy(b.view(np.int16).copy()).view(torch.bfloat16).float().numpy()
    assert np.array_equal(w.view(np.uint32), theirs.view(np.uint32))
    ok = ~np.isnan(w)
    assert np.array_equal(f32_to_bf16_bits(w)[ok], b[ok])                        # narrowing a bf16 value is the identity
    assert np.array_equal(bf16_round(w[ok]).view(np.uint32), w[ok].view(np.uint32))


def test_every_bf16_user_shares_the_pair():
    "The formats that convert bf16 call the one pair (their old names are aliases of it)."
    import nac_lab.nem.execution.memory as nem, nac_lab.ark.exec as ark, nac_lab.trillim.files as tri, nac_lab.irv2.quant as irq
    import nac_lab.lower.reference as lq
    for m in (nem, ark, tri, irq):
        assert m.f32_to_bf16 is f32_to_bf16_bits and m.bf16_to_f32 is bf16_bits_to_f32, m.__name__
    assert lq.bf16_rne is bf16_round
