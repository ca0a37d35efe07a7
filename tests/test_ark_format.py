"""ARK model files: byte-identical rewrite of every real file, era conversion, the fast and general readers
agree, typed errors with JSON paths under seeded fuzzing, nlohmann's number format."""
import json, random, re
import numpy as np
import pytest
from nac_lab.binio import NacLabError
from nac_lab.core import data_path
from nac_lab.cli import run_cli
from nac_lab.ark.format import (ArkFormatError, read_ark, ark_text, write_ark, parse_model, parse_text, fmt_double)
from nac_lab.ark.check import tp_mlp

REAL = sorted(data_path('ark').glob('*.json'))


def test_real_files_present_and_documented():
    assert len(REAL) == 6
    src = (data_path('ark') / 'SOURCES.md').read_text()
    for f in REAL:
        commit = re.search(r'_([0-9a-f]{8})_', f.name)[1]
        assert commit in src and f.name in src
    assert 'MIT License' in src and 'Copyright (c) Microsoft Corporation.' in src


@pytest.mark.parametrize('f', REAL, ids=lambda p: p.name)
def test_real_file_rewrites_byte_identical(f, tmp_path):
    raw = f.read_bytes()
    assert ark_text(read_ark(f)).encode() == raw
    rc, out, err = run_cli('ark', 'rewrite', f, '-o', tmp_path / 'o.json')
    assert rc == 0 and 'identical to' in out and (tmp_path / 'o.json').read_bytes() == raw


@pytest.mark.parametrize('f', REAL, ids=lambda p: p.name)
def test_fast_and_general_readers_agree(f):
    text = f.read_text()
    a, b = read_ark(text), parse_model(parse_text(text), text)
    assert ark_text(a) == ark_text(b) == text
    assert a.style == b.style


def test_era_conversion_of_real_files():
    op = (data_path('ark') / 'tutorial_model_877b0e63_op.json').read_text()
    m = read_ark(op)
    as_ops = ark_text(m, 'ops')
    assert '"Ops": [' in as_ops and '"Op": {' not in as_ops
    assert ark_text(read_ark(as_ops), 'op') == op
    # the dense Ops file has a node with 3 ops: it cannot be written in the Op era, and the CLI says why
    rc, out, err = run_cli('ark', 'rewrite', data_path('ark') / 'tutorial_model_e3cc6e32_ops_dense.json', '-o', '/nonexistent-dir/x.json',
                           '--era', 'op')
    assert rc == 1 and 'Nodes[0]: has 3 ops' in err


def test_generated_models_round_trip_both_eras():
    for r in (0, 1):
        m, _ = tp_mlp(r)
        for era in ('ops', 'op'):
            t = ark_text(m, era)
            assert ark_text(read_ark(t)) == t


def _flip_value(obj, rng):
    "Replace one random leaf (or container) of a JSON tree by a value of another type; return its path."
    path, cur = [], obj
    while isinstance(cur, (dict, list)) and cur and rng.random() < 0.85:
        k = rng.choice(list(cur)) if isinstance(cur, dict) else rng.randrange(len(cur))
        parent, cur = cur, cur[k]
        path.append(k)
    if not path: return None
    parent[path[-1]] = rng.choice(['x', -1, 2 ** 70, 1.5, None, True, [], {}, [[1]], {'INT': 1}])
    return path


def test_fuzz_values_typed_errors_with_paths():
    rng = random.Random(1234)
    base = json.loads((data_path('ark') / 'tutorial_model_877b0e63_op.json').read_text())
    n_err = 0
    for _ in range(300):
        d = json.loads(json.dumps(base))
        if _flip_value(d, rng) is None: continue
        try: read_ark(json.dumps(d))
        except ArkFormatError as ex:
            n_err += 1
            assert str(ex).startswith('ARK: ') and ex.msg
        except NacLabError: n_err += 1
    assert n_err > 100


def test_fuzz_bytes_never_crash_and_reach_the_validator():
    "Byte mutations of digits keep the JSON well formed, so most reach the model validator and the checker (not the JSON parser)."
    from nac_lab.ark.check import check_model
    rng = random.Random(99)
    raw = bytes((data_path('ark') / 'tutorial_model_e3cc6e32_ops_dense.json').read_bytes())
    spots = [k for k, c in enumerate(raw) if chr(c).isdigit()]          # digits of ids, shapes, strides, offsets, ranks, tags
    reached, checked, flagged = 0, 0, 0
    for _ in range(300):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.choice(spots)] = ord(rng.choice('0123456789-'))
        try: json.loads(bytes(b))
        except ValueError: pass
        else: reached += 1
        try: m = read_ark(bytes(b))
        except NacLabError: continue
        checked += 1
        diags = check_model(m)
        flagged += bool(diags)
        for d in diags:
            assert d.code and d.path is not None and d.message        # located diagnostics, never an exception
    # measured with this seed: 233 valid JSON, 206 readable models, 197 of them with diagnostics
    assert reached >= 200 and checked >= 180 and flagged >= 150, (reached, checked, flagged)


@pytest.mark.parametrize('bad', [[], {}, 7, None])
def test_datatype_of_the_wrong_kind_is_a_typed_error_everywhere(bad, tmp_path):
    "`DataType: []` (and other non-strings) used to crash six commands with a TypeError (exit 3)."
    d = json.loads((data_path('ark') / 'tutorial_model_877b0e63_op.json').read_text())
    d['Nodes'][1]['Op']['ReadTensors'][0]['DataType'] = bad
    f = tmp_path / 'm.json'; f.write_text(json.dumps(d))
    for argv in (['check', f], ['show', f], ['run', f, '--output', tmp_path / 'o.npz'], ['to-nac', f, '-o', tmp_path / 'o.nac'],
                 ['rewrite', f, '-o', tmp_path / 'o.json'], ['graph', f, '-o', tmp_path / 'g.svg']):
        rc, out, err = run_cli('ark', *argv)
        assert rc == 1 and 'Nodes[1].Op.ReadTensors[0].DataType' in err and 'Traceback' not in err, (argv, rc, err)


def test_errors_name_the_json_path():
    d = json.loads((data_path('ark') / 'tutorial_model_e3cc6e32_ops_dense.json').read_text())
    d['Nodes'][2]['Ops'][1]['ReadTensors'][0]['Strides'] = [1, 'a']
    with pytest.raises(ArkFormatError,
                       match=re.escape('Nodes[2].Ops[1].ReadTensors[0].Strides[1]: expected an integer, got '
                                       'a string')): read_ark(json.dumps(d))
    d = json.loads((data_path('ark') / 'tutorial_model_877b0e63_op.json').read_text())
    d['Nodes'][4]['Op']['Args'] = {'Axis': {'FOO': 1}}
    with pytest.raises(ArkFormatError, match=re.escape("Nodes[4].Op.Args.Axis: unknown argument type 'FOO'")): read_ark(json.dumps(d))
    d['Nodes'][4]['Op']['Args'] = {'Axis': {'INT': 2 ** 31}}
    with pytest.raises(ArkFormatError, match=re.escape('Nodes[4].Op.Args.Axis.INT: 2147483648 is outside')): read_ark(json.dumps(d))
    d['Nodes'][4]['Op']['Args'] = {'F': {'FLOAT': 1e39}}
    with pytest.raises(ArkFormatError, match='not a finite float32'): read_ark(json.dumps(d))
    d['Nodes'][4]['Op']['ReadTensors'][0]['DataType'] = 'FP64'
    with pytest.raises(ArkFormatError,
                       match=re.escape("Nodes[4].Op.ReadTensors[0].DataType: unknown data type 'FP64'")): read_ark(json.dumps(d))


def test_mixed_eras_refused():
    d = json.loads((data_path('ark') / 'tutorial_model_877b0e63_op.json').read_text())
    d['Nodes'][1]['Ops'] = [d['Nodes'][1].pop('Op')]
    with pytest.raises(ArkFormatError, match=re.escape("Nodes[1]: uses 'Ops' while earlier nodes use 'Op'")): read_ark(json.dumps(d))


def test_float32_printing_matches_nlohmann_rules():
    "Shortest round-trip digits of the float32 widened to double; nlohmann switches to exponents outside 1e-4 <= |x| < 1e15."
    g = np.random.default_rng(7)
    vals = np.concatenate([g.standard_normal(500), 10.0 ** g.uniform(-30, 30, 500)]).astype(np.float32)
    for v in vals:
        x = float(v)
        s = fmt_double(x)
        assert float(s) == x                              # round trip
        digits = re.sub(r'e.*$', '', s).replace('-', '').replace('.', '').lstrip('0').rstrip('0')
        assert len(digits) <= len(repr(abs(x)).split('e')[0].replace('.', '').lstrip('0').rstrip('0'))   # no longer than Python's shortest
        ax = abs(x)
        if 1e-4 <= ax < 1e15 or ax == 0: assert 'e' not in s and '.' in s
        else: assert re.fullmatch(r'-?\d(\.\d+)?e[+-]\d{2,3}', s), s


def test_writer_atomic_and_refuses_input(tmp_path):
    p = tmp_path / 'm.json'; p.write_text(ark_text(tp_mlp(0)[0]))
    m = read_ark(p)
    with pytest.raises(NacLabError, match='also an input'): write_ark(m, p)
    assert p.read_text() == ark_text(tp_mlp(0)[0])
    write_ark(m, tmp_path / 'o.json', era='ops')
    assert read_ark(tmp_path / 'o.json').style.era == 'ops'
    assert not list(tmp_path.glob('.*tmp'))


def test_fast_path_agrees_on_tagged_generated_models_and_mutations():
    from nac_lab.bench.ark import gen_rank
    rng = random.Random(3)
    for r in (0, 1):
        text = ark_text(gen_rank(r, 120))
        a, b = read_ark(text), parse_model(parse_text(text), text)
        assert ark_text(a) == ark_text(b) == text
        lines = text.split('\n')
        tl = [k for k, l in enumerate(lines) if l.lstrip().startswith('{"Id":')]
        for _ in range(20):                       # damage one tensor line: both readers must give the same answer
            ls = list(lines); k = rng.choice(tl)
            ls[k] = rng.choice([ls[k].replace('[[', '[[-3000000000,', 1), ls[k].replace('"Rank":-1', '"Rank":"x"'),
                                ls[k].replace(']}', '],"Zz":1}', 1),
                                ls[k].replace('"Shape":[', '"Shape":[true,', 1), ls[k].replace('FP32', 'FP31')])
            t = '\n'.join(ls)
            def res(f):
                try: return ('ok', ark_text(f()))
                except ArkFormatError as ex: return ('err', str(ex))
            assert res(lambda: read_ark(t)) == res(lambda: parse_model(parse_text(t), t))


def test_fast_path_mixed_tensor_arrays_fall_back():
    text = ark_text(tp_mlp(0)[0])
    lines = text.split('\n')
    k = next(i for i, l in enumerate(lines) if l.lstrip().startswith('{"Id":') and l.endswith(','))
    for junk in ('          {"x": 1},', '          7,', '          "s",', '          [1],'):
        t = '\n'.join(lines[:k + 1] + [junk] + lines[k + 1:])
        with pytest.raises(ArkFormatError, match=re.escape('ReadTensors[1]')): read_ark(t)


def test_fast_path_markers_and_json_numbers():
    ("The dense reader replaces tensor lines by integers beyond int64: a file that holds such an integer itself, or a tensor line where "
     "no tensor may be, or a number JSON forbids (a leading zero), reads exactly as the general reader reads it.")
    from nac_lab.bench.ark import gen_rank
    text = ark_text(gen_rank(0, 40))
    lines = text.split('\n')
    tl = [k for k, l in enumerate(lines) if l.lstrip().startswith('{"Id":')]
    def res(t):
        try: return ('ok', ark_text(read_ark(t)))
        except ArkFormatError as ex: return ('err', str(ex))
    def general(t):
        try: return ('ok', ark_text(parse_model(parse_text(t), t)))
        except ArkFormatError as ex: return ('err', str(ex))
    cases = []
    for mark in (10 ** 40, 10 ** 40 + 1, 10 ** 40 + len(tl) - 1):           # a marker-sized integer in a tensor array
        ls = list(lines); k = tl[3]; ls[k] = ls[k][:len(ls[k]) - len(ls[k].lstrip())] + str(mark) + (',' if ls[k].endswith(',') else '')
        cases.append('\n'.join(ls))
    ls = list(lines)                                                       # a tensor line moved into ProducerNodeIds
    p = next(k for k, l in enumerate(ls) if '"ProducerNodeIds": [' in l and l.rstrip().endswith('[0],'))
    ls[p] = ls[p].replace('[0],', '[') ; ls.insert(p + 1, ls[tl[0]]); ls.insert(p + 2, '],')
    cases.append('\n'.join(ls))
    ls = list(lines); ls[tl[5]] = ls[tl[5]].replace('"Shape":[', '"Shape":[0', 1)   # [064, ...]: not JSON
    cases.append('\n'.join(ls))
    for a, b in (('{"Id":', '{"Id":0'), ('"Buffer":{"Id":', '"Buffer":{"Id":0'), ('"Rank":-1', '"Rank":-01'), ('"DataType":"FP32"',
                                                                                                               '"DataType":"FP33"'),
                 ('"Shape":[', '"Shape":[1234567890123456789,')):   # leading zeros in each captured field, a bad type, 19 digits
        ls = list(lines); ls[tl[5]] = ls[tl[5]].replace(a, b, 1); cases.append('\n'.join(ls))
    tagged = next(k for k in tl if '"SendTags":[[' in lines[k])
    ls = list(lines); ls[tagged] = ls[tagged].replace('"SendTags":[[', '"SendTags":[[0', 1); cases.append('\n'.join(ls))
    ls = list(lines); ls[tl[5]] = ls[tl[5]].replace('"Offsets":[0,', '"Offsets":[-0,', 1)   # -0 is JSON: the integer 0
    cases.append('\n'.join(ls))
    for t in cases:
        assert t != text and res(t) == general(t)
    assert res(cases[-1]) == ('ok', text)
