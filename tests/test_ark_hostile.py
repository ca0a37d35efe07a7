"""ARK hostile inputs (issue #28): `DataType` of the wrong JSON kind, sizes past the memory budget, escape sequences
in names, to-nac's one-line error, and a structure-aware fuzz whose mutations reach the validator."""
import json, random
import pytest
from nac_lab.binio import NacLabError
from nac_lab.core import data_path
from nac_lab.cli import run_cli
from nac_lab.ark.format import ArkFormatError, read_ark, ark_text, summary_text
from nac_lab.ark.check import ArkBuilder, check_model
from nac_lab.ark.exec import ArkExecutor, ArkExecError

SRC = data_path('ark') / 'tutorial_model_877b0e63_op.json'


def _doc(): return json.loads(SRC.read_text())


@pytest.mark.parametrize('bad', [[], {}, None, 3])
def test_datatype_of_the_wrong_kind_is_a_typed_error(bad, tmp_path):
    d = _doc(); d['Nodes'][2]['Op']['WriteTensors'][0]['DataType'] = bad
    f = tmp_path / 'bad.json'; f.write_text(json.dumps(d))
    with pytest.raises(ArkFormatError, match=r'Nodes\[2\]\.Op\.WriteTensors\[0\]\.DataType: expected a data type name'): read_ark(f)
    out = tmp_path / 'o'
    for argv in (['check', f], ['show', f], ['run', f, '--output', out / 'x.safetensors'], ['graph', f, '-o', out / 'g.svg'],
                 ['to-nac', f, '-o', out / 'x.nac'], ['rewrite', f, '-o', out / 'x.json']):
        rc, so, se = run_cli('ark', *argv)
        assert rc != 0 and 'internal error' not in se and 'DataType: expected a data type name' in se, (argv, se)


def _big(n=2**40):
    b = ArkBuilder()
    b.relu(b.tensor((1, 4, n)))
    return b.model()


def test_huge_tensor_refused_by_check_and_run(monkeypatch):
    monkeypatch.setenv('NAC_LAB_MAX_BYTES', str(1 << 20))
    diags = check_model(_big())
    assert {(d.path, d.code) for d in diags} == {('Nodes[0].Op.ReadTensors[0].Buffer', 'buffer.size'),
                                                  ('Nodes[0].Op.WriteTensors[0].Buffer', 'buffer.size')}
    assert '17592186044416 bytes' in diags[0].message          # 1 * 4 * 2**40 * 4 bytes, worked out by hand
    with pytest.raises(ArkExecError, match='buffer.size'): ArkExecutor(_big())
    with pytest.raises(ArkExecError, match='above the limit of 1048576 bytes'): ArkExecutor(_big(), check=False)
    assert check_model(_big(2**14)) == []                      # 256 KiB per buffer: inside the budget


def test_show_and_check_escape_names(tmp_path):
    d = _doc(); d['Nodes'][1]['Op']['Name'] = 'ev\x1b[31mil\n'; d['Nodes'][2]['Op']['Name'] = 'ev\x1b[31mil\n'
    f = tmp_path / 'esc.json'; f.write_text(json.dumps(d))
    rc, out, err = run_cli('ark', 'show', f)
    assert rc == 0 and '\x1b' not in out and 'ev\\x1b[31mil' in out
    rc, out, err = run_cli('ark', 'check', f)
    assert rc == 0 and '\x1b' not in out and 'warning[op.name]' in out and "'ev\\x1b[31mil\\n'" in out
    assert '\x1b' not in summary_text(read_ark(f))


def test_to_nac_one_line_error(tmp_path, capfd):
    b = ArkBuilder(); x = b.tensor((2, 3)); y = b.tensor((2, 4))
    b.op('Add', [x, y], (2, 3))                                  # [2,3] + [2,4] does not broadcast
    f = tmp_path / 'add.json'; f.write_text(ark_text(b.model()))
    rc, out, err = run_cli('ark', 'to-nac', f, '-o', tmp_path / 'x.nac')
    cap = capfd.readouterr()
    lines = [s for s in (err + cap.err).splitlines() if s.strip()]
    assert rc != 0 and len(lines) == 1 and 'Traceback' not in err + cap.err, lines[:5]
    assert 'error[op.shape]: Add of shapes [2, 3] and [2, 4]' in lines[0]


# ---- structure-aware fuzz: every case is valid JSON, so it reaches the model reader and the checker
HOSTILE = [[], {}, None, True, -1, 0, 2**31, 2**40, 2**63, -2**63, 1e308, 'x', '\x1b[2J', [[]], [{}], {'INT': []}, [2**40] * 3]


def _places(v, path=()):
    "Every (container, key) pair in a JSON tree."
    if isinstance(v, dict):
        for k, x in v.items(): yield v, k; yield from _places(x)
    elif isinstance(v, list):
        for k, x in enumerate(v): yield v, k; yield from _places(x)


def _mutate(d, rng):
    places = list(_places(d))
    c, k = rng.choice(places)
    r = rng.random()
    if r < 0.25 and isinstance(c, dict): del c[k]                 # a missing key
    elif r < 0.35 and isinstance(c, list): c.append(json.loads(json.dumps(c[k])))   # a repeated element
    else: c[k] = rng.choice(HOSTILE)                              # wrong type, big number, [] / {}


def test_structure_aware_fuzz_reaches_the_validator(monkeypatch):
    monkeypatch.setenv('NAC_LAB_MAX_BYTES', str(1 << 24))
    rng = random.Random(2028)
    base = json.loads((data_path('ark') / 'tutorial_model_e3cc6e32_ops_dense.json').read_text())
    n, refused, checked, faulted = 200, 0, 0, 0
    for _ in range(n):
        d = json.loads(json.dumps(base))
        for _ in range(rng.randint(1, 3)): _mutate(d, rng)
        text = json.dumps(d)
        try: m = read_ark(text)
        except ArkFormatError as ex:                              # the reader's validator: a typed error naming a JSON path
            assert 'JSON' not in ex.msg.split(':')[0] and ex.msg, ex.msg
            refused += 1; continue
        except NacLabError: refused += 1; continue
        diags = check_model(m, 'f.json')                          # the checker: diagnostics, never an exception
        checked += 1; faulted += any(x.severity == 'error' for x in diags)
        summary_text(m); [str(x) for x in diags]
    assert refused + checked == n                                 # every mutated case reached a validator (none a JSON decode error)
    assert refused >= n // 2 and checked >= n // 10, (refused, checked)      # seed 2028: 169 refused by the reader, 31 read
    assert faulted >= checked // 3, (faulted, checked)
