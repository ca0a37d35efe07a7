"""Property and golden tests for nac_lab.nac.format / weights.

* `test_golden_handmade`: a .nac assembled here byte by byte with `struct` straight from the spec
  (§2.2, §3, §4, §5, §6, §9 and decision NAC 2-8), independently of nac_lab's writer; the reader must decode
  the values we put in, and the writer must reproduce the same bytes.
* `test_random_models_round_trip` (hypothesis): random valid models -- random programs over every
  instruction kind, every CNST type, tensors of every dtype and quantization method, random MMAP,
  optional PROC/RSRC/ORCH, random physical section order -- written, read and written again give the
  same bytes and the same model.
"""
import struct
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from nac_lab.binio import FormatError, WriteError
from nac_lab.nac.format import (NacFile, Instruction, MmapRecord, MmapCommand, MmapAction, DataTensor, DType, DTYPE_NP, Orch,
                                QuantMethod, F32List, WRITE_ORDER, CONST_CODES, TENSOR_CODES, read_nac, write_nac,
                                decode_operands, op_name)
from nac_lab.nac.format.weights import quantize, dequantize


def _sec_str(s, lenfmt):
    b = s.encode(); return struct.pack(lenfmt, len(b)) + b


def handmade() -> bytes:
    "A complete .nac built by hand, sections in the decision NAC 3 order, weights internal, quant INT8_TENSOR."
    mmap = b'MMAP' + struct.pack('<I', 1) + struct.pack('<HB', 2, 2) + struct.pack('<BH', 40, 1) + struct.pack('<BH', 10, 2)
    # program: 0 input x; 1 param 0; 2 nac.add(v0, v1) sig 'TT'; 3 custom op 201 sig 'TA' (v2, const 5); 4 return v3
    ops = (b'OPS ' + struct.pack('<I', 5)
           + struct.pack('<BB', 2, 0)
           + struct.pack('<BBhh', 2, 1, 1, 0)
           + struct.pack('<BBhh', 11, 1, -2, -1)
           + struct.pack('<BBhhhh', 201, 2, 1, 5, -1, 0)
           + struct.pack('<BBhhh', 3, 0, 1, 0, -1))
    cmap = b'CMAP' + struct.pack('<I', 1) + struct.pack('<H', 201) + _sec_str('aten.sum.dim_IntList', '<B')
    cnst = (b'CNST' + struct.pack('<I', 3) + struct.pack('<HBH', 1, 0, 0) + struct.pack('<HBHq', 5, 2, 8, -1)
            + struct.pack('<HBH', 6, 6, 2) + struct.pack('<2f', 0.5, -4.0))
    perm = b'PERM' + struct.pack('<I', 2) + struct.pack('<H', 1) + _sec_str('TT', '<B') + struct.pack('<H', 2) + _sec_str('TA', '<B')
    meta = struct.pack('<BB2IBf', 7, 2, 2, 3, 2, 0.25)                      # int8 [2,3], quant 2, scale 0.25
    payload = np.array([[1, -2, 3], [4, -5, 127]], np.int8).tobytes()
    data = (b'DATA' + struct.pack('<I', 1) + struct.pack('<H', 0) + _sec_str('w', '<H')
            + struct.pack('<I', 1) + struct.pack('<H', 0) + _sec_str('x', '<H')
            + struct.pack('<I', 1) + struct.pack('<HIQ', 0, len(meta), len(payload)) + meta + payload)
    proc = b'PROC' + struct.pack('<I', 3) + b'tok'
    rsrc = b'RSRC' + struct.pack('<I', 1) + _sec_str('v.json', '<H') + struct.pack('<I', 2) + b'{}'
    orch = b'ORCH' + struct.pack('<II', 2, 1) + b'\xaa\xbb' + b'\x01'
    body, offs, pos = b'', {}, 88
    for name, sec in (('MMAP', mmap), ('OPS', ops), ('CMAP', cmap), ('CNST', cnst), ('PERM', perm), ('DATA', data),
                      ('PROC', proc), ('RSRC', rsrc), ('ORCH', orch)):
        offs[name] = pos; body += sec; pos += len(sec)
    order = ('MMAP', 'OPS', 'CMAP', 'CNST', 'PERM', 'DATA', 'PROC', 'ORCH', 'RSRC')     # §2.2.5 table order
    hdr = b'NAC' + struct.pack('<BBHHBH', 1, 0x80 | 2, 1, 1, 0, 3) + struct.pack('<9Q', *[offs[n] for n in order]) + bytes(4)
    assert len(hdr) == 88
    return hdr + body


def test_golden_handmade():
    raw = handmade()
    nac = read_nac(raw)
    assert (nac.version, nac.quant_method, nac.weights_internal, nac.n_inputs, nac.n_outputs, nac.d_model) == (1, QuantMethod.INT8_TENSOR,
                                                                                                               True, 1, 1, 3)
    assert [(i.A, i.B, i.C, i.D) for i in nac.ops] == [(2, 0, [], []), (2, 1, [1, 0], []), (11, 1, [], [-2, -1]),
                                                        (201, 2, [1, 5], [-1, 0]), (3, 0, [1, 0], [-1])]
    assert nac.constants == {1: None, 5: -1, 6: [0.5, -4.0]} and isinstance(nac.constants[6], F32List)
    assert nac.perm == {1: 'TT', 2: 'TA'} and nac.cmap == {201: 'aten.sum.dim_IntList'}
    assert op_name(nac, 201) == 'aten.sum.dim_IntList' and op_name(nac, 11) == 'nac.add'
    assert nac.mmap == [MmapRecord(2, [MmapCommand(MmapAction.PRELOAD, 1), MmapCommand(MmapAction.SAVE_RESULT, 2)])]
    assert nac.param_names == {0: 'w'} and nac.input_names == {0: 'x'}
    t = nac.tensors[0]
    assert (t.dtype, t.shape, t.quant, t.scale) == (DType.I8, (2, 3), QuantMethod.INT8_TENSOR, 0.25)
    assert dequantize(t).tolist() == [[0.25, -0.5, 0.75], [1.0, -1.25, 31.75]]
    assert nac.proc == b'tok' and nac.rsrc == {'v.json': b'{}'} and nac.orch == Orch(b'\xaa\xbb', 1, b'\x01')
    o = decode_operands(nac, 3)
    assert [(a.code, a.ref, a.const) for a in o.args] == [('T', 2, None), ('A', None, 5)]
    assert decode_operands(nac, 4).refs == [3] and decode_operands(nac, 1).param_id == 0
    assert write_nac(nac) == raw                 # align is irrelevant: padding read back is kept


def test_golden_errors_locate():
    raw = bytearray(handmade())
    o_ops = struct.unpack_from('<Q', raw, 20)[0]
    bad = bytearray(raw); struct.pack_into('<h', bad, o_ops + 8 + 2 + 6 + 2, 1)       # inst 2 D[0] = +1 (forward)
    with pytest.raises(FormatError) as ei: read_nac(bytes(bad))
    assert ei.value.section == 'OPS instruction 2' and ei.value.offset == o_ops + 8 + 8 and 'backwards' in str(ei.value)
    bad = bytearray(raw); struct.pack_into('<h', bad, o_ops + 8 + 2 + 6 + 6 + 4, 9)    # inst 3 constant id 9 (absent)
    with pytest.raises(FormatError, match='constant id 9 is not in CNST'): read_nac(bytes(bad))
    bad = bytearray(raw); struct.pack_into('<h', bad, o_ops + 8 + 2 + 4, 3)             # <INPUT B=1> parameter 3
    with pytest.raises(FormatError, match='parameter id 3 is not in DATA block 1'): read_nac(bytes(bad))



def test_golden_ops_extent_and_output_count():
    """OPS must fill its section exactly, a short signature is blamed on the instruction before the bad A/B, and the
    final <OUTPUT B=0> returns the header's n_outputs (offsets by hand: OPS tag+count 8, instructions at +8 +10
    +16 +22 +32, section end +40, where CMAP starts)."""
    raw = handmade()
    o_ops = struct.unpack_from('<Q', raw, 20)[0]
    assert raw[o_ops + 40:o_ops + 44] == b'CMAP'
    def fails(b):
        with pytest.raises(FormatError) as ei: read_nac(bytes(b))
        return ei.value
    bad = bytearray(raw); struct.pack_into('<H', bad, 7, 3)                               # header n_outputs 3, program returns 1
    e = fails(bad)
    assert (type(e).__name__, e.section, e.offset) == ('BadValueError', 'OPS instruction 4', o_ops + 32)
    assert 'n_outputs = 3' in str(e) and 'offset 0x7' in str(e)
    with pytest.raises(WriteError, match='n_outputs = 2'):                                 # the writer refuses it too
        nac = read_nac(raw); nac.n_outputs = 2; write_nac(nac)
    ok = bytearray(raw); struct.pack_into('<H', ok, 7, 0)                                  # 0 = not declared (ruling)
    assert read_nac(bytes(ok)).n_outputs == 0 and write_nac(read_nac(bytes(ok))) == bytes(ok)
    bad = bytearray(raw); struct.pack_into('<I', bad, o_ops + 4, 4)                        # count 4: <OUTPUT> left over
    e = fails(bad)
    assert (e.section, e.offset) == ('OPS section', o_ops + 32) and '8 byte(s) left' in str(e) and 'CMAP' in str(e)
    bad = bytearray(raw); struct.pack_into('<I', bad, o_ops + 4, 6)                        # count 6: runs into CMAP
    e = fails(bad)
    assert (type(e).__name__, e.section, e.offset) == ('TruncatedError', 'OPS instruction 5', o_ops + 40)
    bad = bytearray(raw); bad[o_ops + 17] = 0                                              # nac.add with B=0: D is ''
    e = fails(bad)                                                                         # -2 = fe ff read as A, B
    assert (e.section, e.offset) == ('OPS instruction 3', o_ops + 19)
    assert f'surplus D of instruction 2 at {o_ops + 16:#x}' in str(e) and "signature ''" in str(e)


# ---------------------------------------------------------------- random models (hypothesis)

FLOAT32 = st.floats(width=32, allow_nan=False)
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False),
                   st.text(st.characters(blacklist_categories=('Cs',)), max_size=12),
                   st.lists(st.integers(-2**31, 2**31 - 1), max_size=5), st.lists(FLOAT32, max_size=5).map(F32List))


@st.composite
def models(draw):
    nac = NacFile(d_model=draw(st.integers(0, 0xFFFF)), n_inputs=draw(st.integers(0, 9)), n_outputs=draw(st.integers(0, 9)))
    nac.constants = draw(st.dictionaries(st.integers(0, 0xFFFF), VALUES, min_size=1, max_size=8))
    cids = sorted(nac.constants)
    sigs = draw(st.lists(st.text(TENSOR_CODES + CONST_CODES, min_size=1, max_size=5), min_size=1, max_size=5, unique=True))
    nac.perm = {k + 1: s for k, s in enumerate(sigs)}
    nac.cmap = draw(st.dictionaries(st.integers(201, 255), st.text('abcdefgh.', min_size=1, max_size=20), max_size=3))
    op_ids = list(range(10, 32)) + sorted(nac.cmap)
    nac.param_names = {k: f'p{k}' for k in range(draw(st.integers(0, 4)))}
    n = draw(st.integers(1, 25))
    for i in range(n):
        kinds = ['user', 'state', 'lifted', 'op'] + (['param'] if nac.param_names else []) + (['output', 'cf', 'conv'] if i else [])
        k = draw(st.sampled_from(kinds))
        if k == 'user': ins = Instruction.user_input()
        elif k == 'param': ins = Instruction.param(draw(st.sampled_from(sorted(nac.param_names))))
        elif k == 'state': ins = Instruction.state(draw(st.integers(0, 0x7FFF)))
        elif k == 'lifted': ins = Instruction.lifted(draw(st.sampled_from(cids)))
        elif k == 'output':
            final = draw(st.booleans())      # a final <OUTPUT B=0> returns the header's count when it is declared (non-zero)
            m = nac.n_outputs if final and nac.n_outputs else None
            ins = Instruction.output(draw(st.lists(st.integers(-i, -1), min_size=m or 1, max_size=m or 3)), final=final)
        elif k == 'cf': ins = Instruction.control_flow(draw(st.integers(-i, -1)), draw(st.integers(0, 9)), draw(st.integers(0, 9)))
        elif k == 'conv':
            ins = Instruction.convergence(draw(st.integers(0, 100)), draw(st.integers(-i, 0)), draw(st.integers(-i, n - i)),
                                          draw(st.lists(st.integers(-i, n - i), max_size=3)))
        else:
            B = draw(st.sampled_from([0] + list(nac.perm)))
            sig = nac.perm.get(B, '')
            D, ids = [], []
            for code in sig:
                if i and draw(st.booleans()): D.append(draw(st.integers(-i, -1)))
                else: D.append(0); ids.append(draw(st.sampled_from(cids)))
            has_c = any(c in CONST_CODES for c in sig)
            if not has_c and ids: D = [draw(st.integers(-i, -1)) if i else None for _ in D]
            if None in D: ins = Instruction.user_input()
            else:
                extra = draw(st.lists(st.sampled_from(cids), max_size=2)) if has_c else []
                ins = Instruction(draw(st.sampled_from(op_ids)), B, [len(ids) + len(extra)] + ids + extra if has_c else [], D)
        nac.ops.append(ins)
    nac.input_names = {i: f'in{i}' for i in range(n) if nac.ops[i].A == 2 and nac.ops[i].B in (0, 3) and draw(st.booleans())}
    nac.mmap = [MmapRecord(draw(st.integers(0, n - 1)), [MmapCommand(draw(st.sampled_from(list(MmapAction))), draw(st.integers(0, n - 1)))
                                                         for _ in range(draw(st.integers(0, 3)))]) for _ in range(draw(st.integers(0, 4)))]
    nac.weights_internal = draw(st.booleans())
    nac.quant_method = draw(st.sampled_from(list(QuantMethod)))
    if nac.weights_internal:
        for pid in nac.param_names:
            dt = draw(st.sampled_from(list(DType)))
            shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
            a = np.frombuffer(draw(st.binary(min_size=int(np.prod(shape)) * DTYPE_NP[dt].itemsize,
                                             max_size=int(np.prod(shape)) * DTYPE_NP[dt].itemsize)), DTYPE_NP[dt]).reshape(shape)
            if dt in (DType.F32, DType.F16): a = np.nan_to_num(a.astype(np.float32), nan=0, posinf=1, neginf=-1)
            if dt == DType.BOOL: a = a.view(np.uint8).astype(bool)
            if draw(st.booleans()) or dt not in (DType.F32, DType.F16):
                t = DataTensor(pid, dt, a) if dt not in (DType.F32, DType.F16) else quantize(pid, a)
            else: t = quantize(pid, a, draw(st.sampled_from(list(QuantMethod))))
            if draw(st.booleans()): t.meta_pad = draw(st.binary(max_size=5))
            nac.tensors[pid] = t
    nac.proc = draw(st.one_of(st.none(), st.binary(max_size=8)))
    nac.rsrc = draw(st.one_of(st.none(), st.dictionaries(st.text('abc._', min_size=1, max_size=6), st.binary(max_size=6), max_size=3)))
    nac.orch = draw(st.one_of(st.none(), st.builds(lambda c, p: Orch(c, len(p), p), st.binary(max_size=6), st.binary(max_size=4))))
    nac.layout = draw(st.permutations(list(WRITE_ORDER)))
    nac.reserved = draw(st.integers(0, 255)); nac.padding = draw(st.binary(min_size=4, max_size=4))
    return nac


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(models(), st.sampled_from([1, 8, 64]))
def test_random_models_round_trip(nac, align):
    b1 = write_nac(nac, align=align)
    back = read_nac(b1)
    b2 = write_nac(back, align=align)
    assert b1 == b2
    assert back.ops == nac.ops and back.perm == nac.perm and back.cmap == nac.cmap and back.mmap == nac.mmap
    assert list(back.constants) == list(nac.constants)
    for k, v in nac.constants.items():
        w = back.constants[k]
        assert type(w) in (type(v), list, F32List) and (w == v or (isinstance(v, float) and np.isnan(v)))
    assert (back.proc, back.rsrc, back.orch) == (nac.proc, nac.rsrc, nac.orch)
    for pid, t in nac.tensors.items():
        u = back.tensors[pid]
        assert (u.dtype, u.shape, u.quant) == (t.dtype, t.shape, t.quant) and u.data.tobytes() == t.data.tobytes()
        np.testing.assert_array_equal(dequantize(u), dequantize(t))
    for i in range(len(back.ops)): decode_operands(back, i)


def test_tensor_shape_overflowing_int64():
    """A DATA block 3 shape whose element count overflows int64 (2**31 x 2**31 x 2 = 2**63 uint8), with a matching
    data length field, is a LimitError at the tensor data, not a numpy error after a wrapped size check.
    Offsets by hand (align=1): DATA tag 4, block 1 count 4 + record 5 ('w'), block 2 count 4, block 3 count 4,
    then the record head (pid 2, meta length 4, data length 8) and the metadata (dtype, rank, dims)."""
    from nac_lab.binio import LimitError
    nac = NacFile(ops=[Instruction.param(0)], param_names={0: 'w'})
    nac.tensors = {0: DataTensor(0, DType.U8, np.zeros((1, 1, 1), np.uint8))}
    raw = bytearray(write_nac(nac, align=1))
    rec = nac.sections['DATA'][0] + 21
    assert struct.unpack_from('<HIQBB3IB', raw, rec) == (0, 15, 1, int(DType.U8), 3, 1, 1, 1, 0)
    struct.pack_into('<Q', raw, rec + 6, 2**63)
    struct.pack_into('<3I', raw, rec + 16, 2**31, 2**31, 2)
    with pytest.raises(LimitError) as ei: read_nac(bytes(raw))
    assert ei.value.section == 'DATA block 3 tensor 0' and f'needs {2**63} bytes' in str(ei.value)


def test_writer_refuses_what_the_reader_rejects():
    "Outside OPS too: bad signature codes, tensor metadata the reader would refuse, input names on non-inputs."
    bad = [NacFile(perm={1: 'TX'}),
           NacFile(ops=[Instruction.param(0)], param_names={0: 'w'},
                   tensors={0: DataTensor(0, DType.I8, np.zeros(130, np.int8), QuantMethod.BLOCK_FP8, scales=np.ones(2, np.float32),
                                          block_size=64, orig_shape=(70,))}),          # 2 blocks of 64 do not cover 130
           NacFile(ops=[Instruction.user_input(), Instruction.param(0)], param_names={0: 'w'}, input_names={1: 'x'}),
           NacFile(ops=[Instruction.user_input()], input_names={3: 'x'})]
    for nac in bad:
        with pytest.raises(WriteError): write_nac(nac)
    ok = NacFile(ops=[Instruction.user_input(), Instruction.lifted(1)], constants={1: 2.5}, input_names={0: 'x', 1: 'alpha'})
    assert read_nac(write_nac(ok)).input_names == {0: 'x', 1: 'alpha'}
