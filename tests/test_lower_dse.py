"`nac-lab nem sweep` on a local Dask cluster of 2 workers, and `nac-lab nem lower` end to end."
import contextlib, csv, io, json, re
import numpy as np, pytest
from nac_lab.cli import main
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.nac import zoo
from nac_lab.lower.dse import evaluate, pareto

@pytest.fixture(scope='module')
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp('lower')
    nac_compile(zoo.build_model('cnn'), zoo.example_inputs('cnn')).save(d / 'cnn.nac')
    np.save(d / 'c0.npy', np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32))
    return d

def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()

def test_sweep_cli_two_workers(files):
    d = files
    (d / 'devs').mkdir(exist_ok=True)
    for n in ('npm_lite', 'npm_pro'):
        from nac_lab.core import data_path
        (d / 'devs' / f'{n}.nem').write_text(open(data_path('nem', 'devices', f'{n}.nem')).read())
    rc, out, err = _cli('nem', 'sweep', d / 'cnn.nac', '--devices', d / 'devs', '--tilings', 3, '--calib', d / 'c0.npy',
                        '--workers', 2, '-o', d / 'res.csv', '--plot', d / 'p.png')
    assert rc in (0, None), err
    rows = list(csv.DictReader(open(d / 'res.csv')))
    assert [(r['device'], r['tiling']) for r in rows] == [(dv, t) for dv in ('npm_lite', 'npm_pro') for t in ('1', 'naive', 'search')]
    assert (d / 'p.png').read_bytes()[:4] == b'\x89PNG'
    # the distributed result equals a serial evaluation
    ser = evaluate(d / 'cnn.nac', d / 'devs' / 'npm_lite.nem', calib=[np.load(d / 'c0.npy')], tiling='naive', name='cnn')
    got = next(r for r in rows if r['device'] == 'npm_lite' and r['tiling'] == 'naive')
    assert int(got['cycles']) == ser['cycles'] and int(got['l1_used']) == ser['l1_used']
    assert 'Pareto front' in out

def test_pareto():
    rows = [dict(model='m', l1_used=10, cycles=5), dict(model='m', l1_used=20, cycles=4), dict(model='m', l1_used=20, cycles=6),
            dict(model='m', l1_used=30, cycles=4)]
    assert [(r['l1_used'], r['cycles']) for r in pareto(rows)] == [(10, 5), (20, 4)]

def test_lower_cli_errors(files):
    d = files
    rc, out, err = _cli('nem', 'lower', d / 'cnn.nac', '--device', 'npm_lite', '-o', d / 'o0')   # no flag: float, shapes from the signature
    assert not rc and '(f16 on npm_lite)' in out, err
    rc, out, err = _cli('nem', 'lower', d / 'cnn.nac', '--device', 'npm_lite', '--int8', '--json', '--report-csv', d / 'r.csv',
                        '-o', d / 'o1')
    assert not rc and 'without --calib' in err and json.loads(out)['elem'] == 'int8'
    assert next(csv.DictReader(open(d / 'r.csv')))['layer'].startswith('L')
    rc, out, err = _cli('nem', 'lower', d / 'cnn.nac', '--device', 'npm_lite', '--float', '--float-type', 'f32', '--example', d / 'c0.npy',
                        '-o', d / 'o')
    assert rc and 'nearest variant on npm_lite' in err and not (d / 'o').exists()
    rc, out, err = _cli('nem', 'lower', d / 'cnn.nac', '--device', 'npm_pro_x1', '--float', '--example', d / 'c0.npy', '-o', d / 'o',
                        '--report')
    assert not rc and re.search(r'L\d+_conv2d', out)
    io_ = json.loads((d / 'o' / 'io.json').read_text())
    assert 'quant' not in io_['inputs']['x'] and io_['inputs']['x']['dtype'] == 'float32'
    rc, out, err = _cli('nem', 'lower', d / 'cnn.nac', '--device', 'npm_lite', '--int8', '--calib', d / 'c0.npy', '-o', d / 'c0.npy')
    assert rc and 'exists and is not a folder' in err
