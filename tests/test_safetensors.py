"The foundation safetensors reader/writer against the `safetensors` library, both directions, every dtype numpy has, seeded shapes."
import numpy as np, pytest
from safetensors.numpy import save as st_save, load as st_load
from nac_lab.safetensors import SafetensorsFile, safetensors_bytes, ST_DTYPES, RAW_DTYPES, st_dtype_name
from nac_lab.binio import FormatError

NUMPY_KINDS = [k for k in ST_DTYPES if k not in RAW_DTYPES]

def _tensors(seed):
    "A seeded set of tensors: every numpy-typed dtype once, shapes of rank 0 to 3 including empty ones."
    rng = np.random.default_rng(seed)
    out = {}
    for i, k in enumerate(NUMPY_KINDS):
        shape = tuple(int(d) for d in rng.integers(0, 5, rng.integers(0, 4)))
        dt = np.dtype(ST_DTYPES[k])
        a = rng.random(shape) < 0.5 if dt == np.bool_ else (rng.standard_normal(shape) * 100).astype(dt)
        out[f"t{i}_{k}"] = np.ascontiguousarray(np.asarray(a, dt))
    return out

@pytest.mark.parametrize('seed', range(12))
def test_read_what_the_library_writes(seed):
    x = _tensors(seed)
    f = SafetensorsFile(st_save(x, metadata={'seed': str(seed)}))
    assert f.metadata == {'seed': str(seed)} and set(f.keys()) == set(x)
    for k, a in x.items():
        assert f.entries[k].dtype == st_dtype_name(a.dtype)
        np.testing.assert_array_equal(f.raw(k), a)

@pytest.mark.parametrize('seed', range(12))
def test_library_reads_what_we_write(seed):
    x = _tensors(seed)
    got = st_load(safetensors_bytes(x, {'seed': str(seed)}))
    assert set(got) == set(x)
    for k, a in x.items():
        assert got[k].dtype == a.dtype and got[k].shape == a.shape
        np.testing.assert_array_equal(got[k], a)

def test_bf16_bits_round_trip():
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 16, 64, dtype=np.uint16)
    f = SafetensorsFile(safetensors_bytes({'h': ('BF16', bits)}))
    np.testing.assert_array_equal(f.raw('h'), bits)
    np.testing.assert_array_equal(f.array('h').view(np.uint32), bits.astype(np.uint32) << 16)

def test_every_one_byte_shift_of_a_tensor_is_refused():
    "Shifting any tensor's data_offsets by one byte is an overlap, a gap or outside the data: refused."
    import json
    blob = safetensors_bytes({'a': np.arange(3, dtype=np.int16), 'b': np.arange(2, dtype=np.int32)})
    n = int.from_bytes(blob[:8], 'little'); hdr = json.loads(blob[8:8 + n])
    for name in ('a', 'b'):
        for d in (-1, 1):
            h = json.loads(json.dumps(hdr)); b0, b1 = h[name]['data_offsets']
            if b0 + d < 0: continue
            h[name]['data_offsets'] = [b0 + d, b1 + d]
            raw = json.dumps(h).encode()
            with pytest.raises(FormatError):
                SafetensorsFile(len(raw).to_bytes(8, 'little') + raw + blob[8 + n:])
