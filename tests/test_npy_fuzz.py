"""Fuzz of the one `.npy`/`.npz` reader (`nac_lab.npyio`, issue #28 item 13): seeded mutations of real headers. Every input
either loads -- then numpy's own loader agrees on shape and values -- or is refused with a `FormatError`; nothing else
escapes, nothing allocates more than the budget, and the mutations reach every check (not only the dict parser)."""
import io, re, signal, struct, zipfile
from collections import Counter
import numpy as np, pytest
from nac_lab.binio import FormatError
from nac_lab.npyio import read_npy, read_npz

LIMIT = 1 << 24          # 16 MiB: a header asking for more is refused before allocation

@pytest.fixture(autouse=True)
def bounded():
    def boom(*_): raise TimeoutError('npy fuzz exceeded 120 s')
    old = signal.signal(signal.SIGALRM, boom); signal.alarm(120)
    yield
    signal.alarm(0); signal.signal(signal.SIGALRM, old)

def seeds() -> list:
    "Valid files numpy writes: several dtypes, shapes, both orders, format versions 1, 2 and 3."
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, 4)).astype(np.float32), np.arange(6, dtype='>i4').reshape(2, 3), np.array(True),
              rng.integers(0, 255, (2, 2, 2), dtype=np.uint8), np.asfortranarray(rng.standard_normal((2, 5))),
              np.zeros((0, 3), np.int16), (rng.standard_normal(4) + 1j).astype(np.complex64), np.arange(5, dtype=np.float16)]
    out = []
    for i, a in enumerate(arrays):
        b = io.BytesIO(); np.lib.format.write_array(b, a, version=(1 + i % 3, 0), allow_pickle=False); out.append(b.getvalue())
    return out

DESCRS = ["'|V7'", "'<U3'", "'<M8'", "'|S4'", "'|O'", "'<f16'", "'(2,)<f4'", "[('a', '<f4')]", "'>f8'", "'<c8'", "'|b1'", "'xyz'",
          '3', 'None', "'<i8'", "'>u2'", "'<m8[s]'"]
SHAPES = ['(68719476736,)', '(-1,)', '((2,),)', '(True, 2)', '(2**40,)', '(1 << 62, 4)', '()', '(0,)', '(3, 4)', '(1,) * 70', '[3, 4]',
          '(12,)', '(2, 6)', '(99999999999999999999,)', '(4, 3)', "('3',)"]
ORDERS = ['True', 'False', '0', '1', 'None', "'yes'"]

def mutate(rng, data: bytes) -> bytes:
    kind = rng.integers(0, 8)
    start = 10 if data[6] == 1 else 12
    hlen = struct.unpack_from('<H' if data[6] == 1 else '<I', data, 8)[0]
    text = data[start:start + hlen].decode('latin-1')
    if kind == 0:                                   # flip a byte of the header
        i = int(rng.integers(0, start + hlen)); b = bytearray(data); b[i] ^= int(rng.integers(1, 256)); return bytes(b)
    if kind in (1, 2, 3):                           # rewrite one field of the dict
        key, pool = [('descr', DESCRS), ('shape', SHAPES), ('fortran_order', ORDERS)][kind - 1]
        pat = {'descr': r"'descr': ('[^']*'|\[.*?\])", 'shape': r"'shape': (\([^)]*\))", 'fortran_order': r"'fortran_order': (\w+)"}[key]
        new = re.sub(pat, lambda m: f"'{key}': {pool[int(rng.integers(0, len(pool)))]}", text, count=1)
        h = new.encode('latin-1')
        return data[:8] + (struct.pack('<H', len(h)) if data[6] == 1 else struct.pack('<I', len(h))) + h + data[start + hlen:]
    if kind == 4: return data[:int(rng.integers(0, len(data)))]                       # truncate
    if kind == 5: return data + bytes(rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8))   # trailing bytes
    if kind == 6:                                   # the header length field
        v = int(rng.choice([0, 1, hlen - 1, hlen + 1, 10_001, 65_535, 2 ** 32 - 1]))
        return data[:8] + (struct.pack('<H', min(v, 65_535)) if data[6] == 1 else struct.pack('<I', v)) + data[start:]
    b = bytearray(data); b[6] = int(rng.choice([0, 1, 2, 3, 4, 255])); b[7] = int(rng.choice([0, 0, 1])); return bytes(b)   # version

def stage(msg: str) -> str:
    for key, pat in [('magic', 'magic|format version'), ('length', 'header of|too short|inside the header length'),
                     ('literal', 'not a Python dict literal|not UTF-8|holds'), ('fields', 'fortran_order|non-negative|not a tuple'),
                     ('dtype', 'dtype|descr'), ('span', '2\\*\\*62|dimensions'), ('size', 'data bytes|after the data|ends after'),
                     ('budget', 'above the limit')]:
        if re.search(pat, msg): return key
    return 'other'

def test_npy_header_fuzz(tmp_path):
    rng = np.random.default_rng(28)
    base = seeds(); seen = Counter(); loaded = 0
    p = tmp_path / 'f.npy'
    for n in range(3000):
        data = mutate(rng, base[n % len(base)])
        p.write_bytes(data)
        limit = 32 if n % 7 == 0 else LIMIT          # now and then a budget most seeds exceed
        try: a = read_npy(p, limit=limit)
        except FormatError as ex: seen[stage(str(ex))] += 1; continue
        loaded += 1
        assert a.nbytes <= limit and a.dtype.kind in 'biufc' and a.dtype.byteorder in '=|<'
        ref = np.load(io.BytesIO(data), allow_pickle=False)           # numpy's loader as the oracle for what loads
        assert ref.shape == a.shape and np.array_equal(ref, a, equal_nan=a.dtype.kind in 'fc'), n
    assert seen['other'] == 0, seen
    for key in ('magic', 'length', 'literal', 'fields', 'dtype', 'span', 'size', 'budget'):
        assert seen[key] >= 10, (key, seen)          # every check is reached by the mutations, not only the parser
    assert loaded >= 100, loaded                      # and harmless mutations (reordered dict, same values) still load

def test_npz_member_fuzz(tmp_path):
    "An .npz whose members are mutated .npy files: each member goes through the same checks."
    rng = np.random.default_rng(7)
    base = seeds(); p = tmp_path / 'f.npz'; refused = 0
    for n in range(300):
        with zipfile.ZipFile(p, 'w', compression=zipfile.ZIP_DEFLATED if n % 2 else zipfile.ZIP_STORED) as z:
            z.writestr('a.npy', base[0]); z.writestr('b.npy', mutate(rng, base[n % len(base)]))
        try: out = read_npz(p, limit=LIMIT)
        except FormatError as ex:
            refused += 1; assert 'member b.npy' in str(ex), str(ex); continue
        assert sorted(out) == ['a', 'b'] and np.array_equal(out['a'], np.load(io.BytesIO(base[0])))
    assert refused >= 100, refused
