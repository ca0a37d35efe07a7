"""Issue #28 items 11 and 13: hostile `.npy` files given to every command that reads one (`run --input`, `nem run --input`,
`ark run --input`, `schedule build --inputs`, `nem lower --calib`), and output folders and files that must not be destroyed.
Every reproducer ends in one line on stderr naming the file, exit 1, and no output written."""
import os, signal, struct
import numpy as np, pytest
from nac_lab.cli import run_cli
from nac_lab.core import data_path
from nac_lab.nac import zoo
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.ark.format import ark_text
from nac_lab.ark.check import ArkBuilder

NEM_EX = data_path('nem', 'examples', 'conv2d_relu_fixed.nem')

@pytest.fixture(autouse=True)
def bounded():
    "A hang or a header-sized allocation is a failure: every test here ends within 120 s."
    def boom(*_): raise TimeoutError('hostile-input test exceeded 120 s')
    old = signal.signal(signal.SIGALRM, boom); signal.alarm(120)
    yield
    signal.alarm(0); signal.signal(signal.SIGALRM, old)

def npy(header: str, data: bytes = b'', pad_to: int | None = None) -> bytes:
    "A version-1 `.npy` file written by hand: magic, version, header length, header text (padded with spaces), data."
    h = header if pad_to is None else header.rstrip('\n').ljust(pad_to - 11 - len(data)) + '\n'     # numpy pads before the newline
    return b'\x93NUMPY\x01\x00' + struct.pack('<H', len(h)) + h.encode('latin-1') + data

HUGE = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (68719476736,), }\n", pad_to=128)    # 2**36 float32: 256 GiB
HOSTILE = {
    'huge': (HUGE, 'needs 274877906944 data bytes, the file has 0'),
    'void': (npy("{'descr': '|V7', 'fortran_order': False, 'shape': (1,), }", bytes(7)), "dtype |V7 ('V' kind) is not a number type"),
    'unicode': (npy("{'descr': '<U3', 'fortran_order': False, 'shape': (1,), }", bytes(12)), "dtype <U3 ('U' kind) is not a number"),
    'datetime': (npy("{'descr': '<M8[s]', 'fortran_order': False, 'shape': (1,), }", bytes(8)), "('M' kind) is not a number type"),
    'structured': (npy("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (1,), }", bytes(8)),
                   'descr is a structured dtype'),
    'pickle': (npy("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", bytes(8)), "('O' kind) is not a number type"),
}

@pytest.fixture(scope='module')
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp('npy_hostile')
    nac_compile(zoo.build_model('mlp'), zoo.example_inputs('mlp')).save(d / 'mlp.nac')
    nac_compile(zoo.build_model('cnn'), zoo.example_inputs('cnn')).save(d / 'cnn.nac')
    b = ArkBuilder(); x = b.tensor((2, 3)); b.relu(x)
    (d / 'm.json').write_text(ark_text(b.model()))
    return d, x.id

def commands(d, xid, p, out):
    return {'run': ('run', d / 'mlp.nac', '--input', f'0={p}', '--output', out / 'o.npz'),
            'nem run': ('nem', 'run', NEM_EX, '--input', f'B_L2={p}', '--output', out / 'o.npz'),
            'ark run': ('ark', 'run', d / 'm.json', '--input', f'{xid}={p}', '--output', out / 'o.npz'),
            'schedule build': ('schedule', 'build', d / 'mlp.nac', '--inputs', p, '-o', out / 'o.nac'),
            'nem lower': ('nem', 'lower', d / 'cnn.nac', '--device', 'npm_lite', '--int8', '--calib', p, '-o', out / 'lowered')}

@pytest.mark.parametrize('case', sorted(HOSTILE))
@pytest.mark.parametrize('cmd', ['run', 'nem run', 'ark run', 'schedule build', 'nem lower'])
def test_hostile_npy_every_command(models, tmp_path, cmd, case):
    d, xid = models
    data, msg = HOSTILE[case]
    p = tmp_path / f'{case}.npy'; p.write_bytes(data)
    out = tmp_path / 'out'; out.mkdir()
    rc, o, err = run_cli(*map(str, commands(d, xid, p, out)[cmd]))
    assert rc == 1, (rc, err)
    assert err.startswith('nac-lab: error: ') and err.count('\n') == 1, err
    assert f'.npy file {p}' in err and msg in err, err
    assert list(out.iterdir()) == [], 'nothing may be written'

def test_huge_file_is_128_bytes():
    assert len(HUGE) == 128

@pytest.mark.parametrize('cmd', ['run', 'ark run'])
def test_big_endian_input_is_converted(models, tmp_path, cmd):
    "A big-endian float32 input gives exactly the output of the same values stored little-endian."
    d, xid = models
    shape = (1, 32) if cmd == 'run' else (2, 3)
    vals = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    results = []
    for order in ('<', '>'):
        p = tmp_path / f'x{order == ">"}.npy'
        hdr = f"{{'descr': '{order}f4', 'fortran_order': False, 'shape': {shape}, }}"
        p.write_bytes(npy(hdr, vals.astype(order + 'f4').tobytes()))
        out = tmp_path / f'o{order == ">"}'; out.mkdir()
        rc, o, err = run_cli(*map(str, commands(d, xid, p, out)[cmd]))
        assert rc == 0, err
        with np.load(out / 'o.npz') as z: results.append({k: z[k] for k in z.files})
    assert results[0].keys() == results[1].keys() and all(np.array_equal(results[0][k], results[1][k]) for k in results[0])
    if cmd == 'ark run': assert np.array_equal(next(iter(results[1].values())), np.maximum(vals, 0))

@pytest.mark.parametrize('bad, msg', [(np.nan, 'is not finite'), (np.inf, 'is not finite'), (-np.inf, 'is not finite'),
                                      (3e38, 'is above 1.84e+19 in magnitude')])
def test_calibration_values_must_be_finite_and_bounded(models, tmp_path, bad, msg):
    d, _ = models
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32); x[0, 2, 5, 7] = bad
    np.save(tmp_path / 'c.npy', x)
    rc, o, err = run_cli('nem', 'lower', str(d / 'cnn.nac'), '--device', 'npm_lite', '--int8', '--calib', str(tmp_path / 'c.npy'),
                         '-o', str(tmp_path / 'lowered'))
    assert rc == 1 and f'--calib {tmp_path / "c.npy"}' in err and f'at index [0, 2, 5, 7] {msg}' in err, err
    assert not (tmp_path / 'lowered').exists()

def test_lower_refuses_a_folder_it_did_not_write(models, tmp_path):
    "Issue #28 item 11: `nem lower -o DIR` replaced a folder holding a user's notes.txt (exit 0); `-o .` left a `..xxx.old` folder."
    d, _ = models
    np.save(tmp_path / 'c.npy', np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32))
    argv = ['nem', 'lower', str(d / 'cnn.nac'), '--device', 'npm_lite', '--int8', '--calib', str(tmp_path / 'c.npy'), '-o']
    user = tmp_path / 'mine'; user.mkdir(); (user / 'notes.txt').write_text('my notes')
    rc, o, err = run_cli(*argv, str(user))
    assert rc == 1 and 'holds files this command did not write (notes.txt)' in err, err
    assert [p.name for p in user.iterdir()] == ['notes.txt'] and (user / 'notes.txt').read_text() == 'my notes'
    # a folder the command wrote is replaced by a second run, with the same files
    rc, o, err = run_cli(*argv, str(tmp_path / 'out'))
    assert rc == 0, err
    first = sorted(p.name for p in (tmp_path / 'out').iterdir())
    assert 'model.nem' in first and 'io.json' in first
    rc, o, err = run_cli(*argv, str(tmp_path / 'out'))
    assert rc == 0 and sorted(p.name for p in (tmp_path / 'out').iterdir()) == first, err
    # ... but not once a user's file is in it
    (tmp_path / 'out' / 'notes.txt').write_text('added')
    rc, o, err = run_cli(*argv, str(tmp_path / 'out'))
    assert rc == 1 and 'notes.txt' in err and (tmp_path / 'out' / 'notes.txt').read_text() == 'added'
    # the current folder, even one the command could own
    old = os.getcwd(); os.chdir(tmp_path / 'out'); (tmp_path / 'out' / 'notes.txt').unlink()
    try: rc, o, err = run_cli(*argv, '.')
    finally: os.chdir(old)
    assert rc == 1 and 'output folder . is the current folder' in err, err
    assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith('.')], 'no .old or .tmp folder is left behind'

def test_lower_refuses_a_device_include_outside_the_device_folder(models, tmp_path):
    "Issue #28 item 15: `nem lower` copied a file that the device includes from outside the device's folder into OUTDIR."
    d, _ = models
    (tmp_path / 'dev').mkdir()
    (tmp_path / 'npm_pro.nem').write_text(data_path('nem', 'devices', 'npm_pro.nem').read_text())      # outside dev/
    x1 = data_path('nem', 'devices', 'npm_pro_x1.nem').read_text()
    assert x1.count('include "npm_pro.nem"') == 1
    (tmp_path / 'dev' / 'x1.nem').write_text(x1.replace('include "npm_pro.nem"', 'include "../npm_pro.nem"'))
    np.save(tmp_path / 'c.npy', np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32))
    rc, o, err = run_cli('nem', 'lower', str(d / 'cnn.nac'), '--device', str(tmp_path / 'dev' / 'x1.nem'), '--int8', '--calib',
                         str(tmp_path / 'c.npy'), '-o', str(tmp_path / 'out'))
    assert rc == 1 and 'include "../npm_pro.nem" resolves to' in err and 'outside the device folder' in err, err
    assert not (tmp_path / 'out').exists()

def test_npz_member_and_data_folder(models, tmp_path):
    "The same checks on a member of a `schedule build --inputs` archive and on a file of a `nem run --data` folder."
    import zipfile
    d, _ = models
    with zipfile.ZipFile(tmp_path / 'x.npz', 'w') as z: z.writestr('x.npy', HUGE)
    rc, o, err = run_cli('schedule', 'build', str(d / 'mlp.nac'), '--inputs', str(tmp_path / 'x.npz'), '-o', str(tmp_path / 'o.nac'))
    assert rc == 1 and f'--inputs: .npz file {tmp_path / "x.npz"} member x.npy' in err and 'needs 274877906944 data bytes' in err, err
    (tmp_path / 'data').mkdir(); (tmp_path / 'data' / 'X_L2.npy').write_bytes(HOSTILE['unicode'][0])
    rc, o, err = run_cli('nem', 'run', str(NEM_EX), '--data', str(tmp_path / 'data'), '--output', str(tmp_path / 'o.npz'))
    assert rc == 1 and f'--data: .npy file {tmp_path / "data" / "X_L2.npy"}' in err and "dtype <U3 ('U' kind)" in err, err
    assert not (tmp_path / 'o.nac').exists() and not (tmp_path / 'o.npz').exists()
