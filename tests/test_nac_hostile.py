"""Hostile NAC inputs through the command line (issue 13): impossible shapes, a tiny file asking for huge results,
commands whose output would destroy their input, control characters in names, extreme numeric options.

Every case must end in a typed one-line error (exit code 1 or 2, never 3 = internal error) that names the file and the
place, and must leave the input files untouched.
"""
import json, struct
import numpy as np
import pytest
import torch

from nac_lab.cli import run_cli
from nac_lab.nac.format import NacFile, Instruction, DataTensor, DType, write_nac
from nac_lab.nac.schedule.mmap_sim import demo_nac


def _base(internal=True):
    nac = NacFile(n_inputs=1, n_outputs=1, weights_internal=internal)
    nac.ops = [Instruction.user_input(), Instruction.param(0)]
    nac.param_names = {0: 'w'}; nac.input_names = {0: 'x'}
    nac.cmap[201] = 'aten.add.Tensor'; nac.add_op(201, 'TT', [('ref', 0), ('ref', 1)])
    nac.ops.append(Instruction.output([-1]))
    return nac


def _internal_with_shape(shape):
    "A file whose DATA block 3 tensor metadata declares `shape` (written with room to spare, then patched)."
    nac = _base(); nac.orch = None
    nac.tensors = {0: DataTensor(0, DType.F32, np.zeros((0,), np.float32), meta_pad=bytes(300))}
    b = bytearray(write_nac(nac))
    i = b.rfind(bytes([0, 1, 0, 0, 0, 0, 0]) + bytes(300))
    new = bytes([0, len(shape)]) + struct.pack(f'<{len(shape)}I', *shape) + b'\x00'
    b[i:i + len(new)] = new
    return bytes(b)


def _st(header: dict, data: bytes = b'') -> bytes:
    h = json.dumps(header).encode(); h += b' ' * (-len(h) % 8)
    return len(h).to_bytes(8, 'little') + h + data


SHAPES = {'rank65': [0] * 65, 'zero_beside_huge': [0, 2**32 - 1, 2**32 - 1]}


def _x(tmp_path):
    np.save(tmp_path / 'x.npy', np.zeros(3, np.float32)); return f'x={tmp_path / "x.npy"}'


def _commands(tmp_path, f):
    return [('inspect', str(f)), ('run', str(f), '-i', _x(tmp_path)), ('schedule', 'check', str(f)),
            ('rewrite', str(f), str(tmp_path / 'out.nac'))]


@pytest.mark.parametrize('shape', list(SHAPES), ids=list(SHAPES))
def test_impossible_internal_shapes(tmp_path, shape):
    f = tmp_path / 'm.nac'; f.write_bytes(_internal_with_shape(SHAPES[shape]))
    for cmd in _commands(tmp_path, f):
        rc, out, err = run_cli(*cmd)
        assert rc == 1 and err.count('\n') == 1, (cmd, rc, err)
        assert 'NAC ' in err and 'm.nac' in err and 'DATA block 3 tensor 0' in err, err
        assert ('65 dimensions' in err) if shape == 'rank65' else ('spans more than 2**62 bytes' in err)
    assert not (tmp_path / 'out.nac').exists()


@pytest.mark.parametrize('shape', list(SHAPES), ids=list(SHAPES))
def test_impossible_external_shapes(tmp_path, shape):
    f = tmp_path / 'e.nac'; f.write_bytes(write_nac(_base(internal=False)))
    (tmp_path / 'e.safetensors').write_bytes(_st({'w': {'dtype': 'F32', 'shape': SHAPES[shape], 'data_offsets': [0, 0]}}))
    rc, out, err = run_cli('run', str(f), '-i', _x(tmp_path))
    assert rc == 1 and "e.safetensors" in err and "tensor 'w'" in err, err
    rc, out, err = run_cli('inspect', str(f))
    assert rc in (0, 1) and 'internal error' not in err


@pytest.mark.parametrize('shape', list(SHAPES), ids=list(SHAPES))
def test_impossible_block_fp8_original_shape(tmp_path, shape):
    f = tmp_path / 'b.nac'; f.write_bytes(write_nac(_base(internal=False)))
    meta = {'w': json.dumps({'quant_type': 'BLOCK_FP8', 'block_size': 64, 'orig_shape': SHAPES[shape], 'scales': [1.0]})}
    (tmp_path / 'b.safetensors').write_bytes(_st({'__metadata__': meta, 'w': {'dtype': 'I8', 'shape': [64], 'data_offsets': [0, 64]}},
                                                 bytes(64)))
    rc, out, err = run_cli('run', str(f), '-i', _x(tmp_path))
    assert rc == 1 and 'b.safetensors' in err and "__metadata__['w']" in err and 'orig_shape' in err, err


def test_small_file_asking_for_a_huge_result_is_refused(tmp_path, monkeypatch):
    "x.repeat(20000, 20000): refused before allocating, naming instruction, size, limit and NAC_LAB_MAX_BYTES."
    nac = NacFile(n_inputs=1, n_outputs=1)
    nac.ops = [Instruction.user_input()]; nac.input_names = {0: 'x'}
    nac.cmap[201] = 'aten.repeat.default'
    nac.add_op(201, 'Ti', [('ref', 0), ('const', [20000, 20000])])
    nac.ops.append(Instruction.output([-1]))
    f = tmp_path / 'r.nac'; f.write_bytes(write_nac(nac))
    assert f.stat().st_size < 300
    np.save(tmp_path / 'x.npy', np.zeros((4, 4), np.float32))
    monkeypatch.setenv('NAC_LAB_MAX_BYTES', str(1 << 30))
    rc, out, err = run_cli('run', str(f), '-i', f'x={tmp_path / "x.npy"}')
    assert rc == 1 and err.count('\n') == 1
    assert 'instruction 1 (aten.repeat.default): the result would take 25600000000 bytes, above the limit of 1073741824 bytes' in err
    assert 'NAC_LAB_MAX_BYTES' in err
    monkeypatch.setenv('NAC_LAB_MAX_BYTES', 'plenty')
    rc, out, err = run_cli('run', str(f), '-i', f'x={tmp_path / "x.npy"}')
    assert rc == 1 and 'NAC_LAB_MAX_BYTES' in err


def test_data_dependent_programs_are_checked_op_by_op(tmp_path, monkeypatch):
    "nonzero has no meta kernel for its output size: the run goes step by step and still refuses the repeat."
    nac = NacFile(n_inputs=1, n_outputs=1)
    nac.ops = [Instruction.user_input()]; nac.input_names = {0: 'x'}
    nac.cmap[201] = 'aten.nonzero.default'; nac.cmap[202] = 'aten.repeat.default'
    nz = nac.add_op(201, 'T', [('ref', 0)])
    nac.add_op(202, 'Ti', [('ref', nz), ('const', [30000, 30000])])
    nac.ops.append(Instruction.output([-1]))
    from nac_lab.nac.runtime.run import Interpreter
    from nac_lab.guard import MemoryLimitError
    monkeypatch.setenv('NAC_LAB_MAX_BYTES', str(1 << 30))
    it = Interpreter(nac)
    with pytest.raises(MemoryLimitError, match=r'instruction 2 \(aten.repeat.default\)'):
        it.run(torch.ones(3))
    small = NacFile(**{k: getattr(nac, k) for k in ('n_inputs', 'n_outputs', 'input_names', 'cmap', 'perm')})
    small.ops = nac.ops[:2] + [Instruction.output([-1])]; small.constants = nac.constants
    torch.testing.assert_close(Interpreter(small).run(torch.tensor([0., 2., 3.]))[0], torch.tensor([[1], [2]]))


def test_outputs_never_overwrite_inputs_or_their_weights(tmp_path):
    nac, sizes = demo_nac()
    nac.weights_internal = False
    m = tmp_path / 'm.nac'; nac.save(m)
    side = tmp_path / 'm.safetensors'
    before = (m.read_bytes(), side.read_bytes())
    cases = [('rewrite', str(m), str(side)),
             ('rewrite', str(m), str(m)),
             ('schedule', 'build', str(m), '-o', str(side)),
             ('schedule', 'build', str(m), '-o', str(m))]
    for cmd in cases:
        rc, out, err = run_cli(*cmd)
        assert rc == 1 and 'refusing to overwrite' in err, (cmd, rc, err)
    assert (m.read_bytes(), side.read_bytes()) == before
    rc, out, err = run_cli('zoo', 'build', 'mlp', '--weights', 'external', '-o', str(tmp_path / 'z.safetensors'))
    assert rc == 1 and 'overwritten by its own external weights file' in err, err
    assert not (tmp_path / 'z.safetensors').exists()
    # a write into a folder that does not exist names the target file
    rc, out, err = run_cli('rewrite', str(m), str(tmp_path / 'no' / 'such' / 'o.nac'))
    assert rc == 1 and 'o.nac' in err and err.count('\n') == 1, err
    # the ordinary case still works, and copies the weights beside the new file
    rc, out, err = run_cli('rewrite', str(m), str(tmp_path / 'copy.nac'))
    assert rc == 0 and (tmp_path / 'copy.safetensors').read_bytes() == before[1]


def test_control_characters_are_escaped_in_tables_and_errors(tmp_path):
    nac, sizes = demo_nac()
    nac.cmap[201] = 'aten.relu.default\x1b[2J\n\u202e'          # the demo's CMAP op, renamed with terminal controls
    nac.param_names[1] = 'fc1.weight\x07\r'
    nac.input_names[0] = 'x\x1b]0;title\x07'
    f = tmp_path / 'c.nac'; f.write_bytes(write_nac(nac))
    for cmd in [('inspect', str(f), '--ops'), ('schedule', 'show', str(f)), ('schedule', 'check', str(f)),
                ('run', str(f), '-i', f'0={tmp_path / "x.npy"}')]:
        np.save(tmp_path / 'x.npy', np.zeros((1, 16), np.float32))
        rc, out, err = run_cli(*cmd)
        for ch in ('\x1b', '\x07', '\r', '\u202e'):
            assert ch not in out and ch not in err, (cmd, ch)
        assert err.count('\n') <= 1
    rc, out, err = run_cli('inspect', str(f), '--ops')
    assert '\\x1b[2J\\x0a\\u202e' in out



def test_newlines_in_names_do_not_fake_table_rows(tmp_path):
    "Issue 28 item 14: a parameter, input, op or resource name with a newline stays in its own row/line, escaped."
    def named(sep, name):
        nac, _ = demo_nac()
        nac.param_names[1] = f'W1{sep} 9  fake.weight  float32  1  NONE  4'
        nac.input_names[0] = f'x{sep}7         fake_input'
        nac.cmap[201] = f'aten.relu.default{sep}fake.op   9'
        nac.rsrc = {**(nac.rsrc or {}), f'notes{sep}.txt': b'abc'}
        f = tmp_path / name; f.write_bytes(write_nac(nac)); return str(f)
    f, plain = named('\n', 'n.nac'), named('_', 'p.nac')            # the same names with '_' for the newline
    for cmd in [('inspect', '{}'), ('inspect', '{}', '--ops'), ('schedule', 'show', '{}'), ('check', '{}')]:
        rc, out, err = run_cli(*[a.format(f) for a in cmd])
        rc0, out0, _ = run_cli(*[a.format(plain) for a in cmd])
        assert out.count('\n') == out0.count('\n'), (cmd, out)           # not one line more than with '_'
        assert 'fake' not in ''.join(l for l in out.splitlines() if '\\x0a' not in l and '\\n' not in l), (cmd, out)   # repr: \\n
    rc, out, _ = run_cli('inspect', f)
    assert 'W1\\x0a 9  fake.weight' in out and 'x\\x0a7         fake_input' in out and 'notes\\x0a.txt (3 B)' in out


def test_tiny_bandwidth_gives_finite_stalls_or_an_error(tmp_path):
    nac, sizes = demo_nac()
    f = tmp_path / 'd.nac'; f.write_bytes(write_nac(nac))
    for bw in ('1e-320', '5e-324', '1e-300'):
        rc, out, err = run_cli('schedule', 'check', str(f), '--sizes', json.dumps(sizes), '--bandwidth', bw, '--json')
        assert 'inf' not in out.lower() and 'nan' not in out.lower() and 'internal error' not in err, (bw, out, err)
        assert rc == 1 and 'bandwidth' in err
    rc, out, err = run_cli('schedule', 'check', str(f), '--sizes', json.dumps(sizes), '--bandwidth', '1e-3', '--json')
    assert rc == 0 and json.loads(out)['stall_ticks'] > 0


def test_sizes_json_is_read_strictly(tmp_path):
    nac, sizes = demo_nac()
    f = tmp_path / 'd.nac'; f.write_bytes(write_nac(nac))
    for text in ['[' * 100000 + ']' * 100000, '[NaN, 1]', '[1' + '0' * 5000 + ']', '{"0": 1e999}']:
        p = tmp_path / 's.json'; p.write_text(text)
        rc, out, err = run_cli('schedule', 'check', str(f), '--sizes', str(p))
        assert rc == 1 and err.count('\n') == 1 and 'internal error' not in err, (text[:20], err)
