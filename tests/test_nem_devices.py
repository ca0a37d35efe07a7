"""NEM documents, devices, type families, the worked examples and the CLI.

Expected values are taken from the spec's text (the example devices, the MUST/MAY tables, the
inheritance rules) or written by hand, not produced by the code under test.
"""
import json
import pytest
from nac_lab.core import data_path
from nac_lab.cli import run_cli
from nac_lab.nem.front.documents import load
from nac_lab.nem.front.devices import DeviceSet
from nac_lab.nem.front.types import parse_variant_ref, instantiations, must_variants, match, OpInstance, nbytes
from nac_lab.nem.analysis.check import check

NEM = data_path('nem')

def ws_of(tmp_path, files, root='main.nem'):
    for name, text in files.items():
        p = tmp_path / name; p.parent.mkdir(parents=True, exist_ok=True); p.write_text(text)
    return load(tmp_path / root, name=root)

# ---------------- includes ----------------
def test_include_relative_and_search_path(tmp_path):
    ws = ws_of(tmp_path, {'main.nem': 'include "sub/dev.nem"\n',
                          'sub/dev.nem': 'include "nem_baseline_1.0.nem"\ndevice d extends nem_baseline_1_0 { }\n'})
    assert ws.diags == [] and set(ws.devices) == {'nem_baseline_1_0', 'd'} and len(ws.families) == 13

def test_include_cycle_three_files(tmp_path):
    ws = ws_of(tmp_path, {'main.nem': 'include "b.nem"\n', 'b.nem': 'include "c.nem"\n', 'c.nem': '\ninclude "b.nem"\n'})
    assert [(d.rule, d.file.split('/')[-1], d.line) for d in ws.diags] == [('include.cycle', 'c.nem', 2)]
    assert 'b.nem -> ' in ws.diags[0].message and ws.diags[0].message.count('b.nem') == 2

def test_include_self_cycle(tmp_path):
    ws = ws_of(tmp_path, {'main.nem': 'include "main.nem"\n'})
    assert [(d.rule, d.line) for d in ws.diags] == [('include.cycle', 1)]

def test_include_diamond_is_not_duplicate(tmp_path):
    ws = ws_of(tmp_path, {'main.nem': 'include "a.nem"\ninclude "b.nem"\n', 'a.nem': 'include "nem_baseline_1.0.nem"\n',
                          'b.nem': 'include "nem_baseline_1.0.nem"\n'})
    assert ws.diags == []

def test_include_duplicate_device_two_files(tmp_path):
    dev = 'device x { spec_version = "1.0" opcode.mandatory { cast.default } }\n'
    ws = ws_of(tmp_path, {'main.nem': 'include "a.nem"\ninclude "b.nem"\n', 'a.nem': dev, 'b.nem': '\n' + dev})
    assert [(d.rule, d.file.split('/')[-1], d.line) for d in ws.diags] == [('include.duplicate', 'b.nem', 2)]
    assert "device 'x'" in ws.diags[0].message and 'a.nem:1' in ws.diags[0].notes[0]

def test_include_duplicate_family(tmp_path):
    fam = 'type_family eltwise<T: {f16}> {\n input: T\n output: T\n variants:\n  default: {}\n   conformance: { MUST <f16> }\n}\n'
    ws = ws_of(tmp_path, {'main.nem': 'include "nem_baseline_1.0.nem"\ninclude "f.nem"\n', 'f.nem': fam})
    assert [(d.rule, d.line) for d in ws.diags] == [('include.duplicate', 1)] and "type family 'eltwise'" in ws.diags[0].message

def test_include_not_found_and_syntax_error_in_include(tmp_path):
    ws = ws_of(tmp_path, {'main.nem': 'include "bad.nem"\ninclude "missing.nem"\n', 'bad.nem': 'device d {\n  topology ( }\n}\n'})
    got = sorted((d.rule, d.file.split('/')[-1], d.line) for d in ws.diags)
    assert got == [('include.not-found', 'main.nem', 2), ('syntax', 'bad.nem', 2)]

def test_included_program_is_ignored(tmp_path):
    ws = ws_of(tmp_path, {'main.nem': 'include "p.nem"\nconst a = 1\n', 'p.nem': 'include "nem_baseline_1.0.nem"\nconst zzz = 1 / 0\n'})
    r = check(tmp_path / 'main.nem', name='main.nem')
    assert ws.diags == [] and r.ok and 'nem_baseline_1_0' in ws.devices

# ---------------- variant references and type families ----------------
@pytest.mark.parametrize('text,family,inst,variant', [
    ('gemm.float<f16>.no_bias', 'gemm.float', ('f16',), 'no_bias'), ('conv2d.int4.with_bias', 'conv2d.int4', (), 'with_bias'),
    ('cast.default', 'cast', (), 'default'), ('dequantize<i8, f32>.default', 'dequantize', ('i8', 'f32'), 'default'),
    ('eltwise<bf16>.default', 'eltwise', ('bf16',), 'default')])
def test_variant_ref(text, family, inst, variant):
    r = parse_variant_ref(text)
    assert (r.family, r.inst, r.variant, str(r)) == (family, inst, variant, text)

def test_must_and_may_tables_from_baseline():
    must = {'gemm.int8<i8>.no_bias', 'gemm.int8<i8>.with_bias', 'gemm.float<f16>.no_bias', 'gemm.float<f16>.with_bias',
            'conv2d.int8<i8>.no_bias',
            'conv2d.int8<i8>.with_bias', 'conv2d.float<f16>.no_bias', 'conv2d.float<f16>.with_bias', 'eltwise<i8>.default',
                'eltwise<f16>.default',
            'view<i8>.default', 'view<f16>.default', 'norm<f16>.default', 'softmax<f16>.default', 'cast.default',
                'quantize<f16, i8>.default',
            'dequantize<i8, f16>.default'}
    may = {'gemm.int8<i16>.with_bias', 'gemm.float<bf16>.no_bias', 'gemm.float<f32>.no_bias', 'conv2d.int8<i16>.with_bias',
           'conv2d.float<bf16>.no_bias',
           'conv2d.float<bf16>.with_bias', 'conv2d.float<f32>.no_bias', 'conv2d.float<f32>.with_bias', 'eltwise<i16>.default',
               'eltwise<i32>.default',
           'eltwise<bf16>.default', 'eltwise<f32>.default', 'view<i16>.default', 'view<i32>.default', 'view<bf16>.default',
               'view<f32>.default',
           'norm<bf16>.default', 'norm<f32>.default', 'softmax<bf16>.default', 'softmax<f32>.default', 'gemm.int4.no_bias',
               'gemm.int4.with_bias',
           'conv2d.int4.no_bias', 'conv2d.int4.with_bias', 'quantize<f32, i8>.default', 'dequantize<i8, f32>.default'}
    insts = instantiations()
    assert {str(r) for r, i in insts.items() if i.cls == 'MUST'} == must
    assert {str(r) for r, i in insts.items() if i.cls == 'MAY'} == may
    assert set(map(str, must_variants())) == must

def test_match_int4_gemm_needs_quant_on_B():
    x = OpInstance('gemm', dict(A=('i8', True), B=('i4', False)), dict(Y=('i8', False)), 'i32')
    ok, (near, diff) = match(x)
    assert ok == [] and str(near.ref) == 'gemm.int4.no_bias' and diff == ['B needs a quant descriptor']
    x.ins['B'] = ('i4', True)
    assert [str(i.ref) for i in match(x)[0]] == ['gemm.int4.no_bias']

def test_match_bias_absent_rule():
    x = OpInstance('gemm', dict(A=('f16', False), B=('f16', False), C=('f16', False)), dict(Y=('f16', False)), 'f32')
    assert [str(i.ref) for i in match(x)[0]] == ['gemm.float<f16>.with_bias']
    x = OpInstance('gemm', dict(A=('bf16', False), B=('bf16', False), C=('bf16', False)), dict(Y=('bf16', False)), 'f32')
    ok, (near, diff) = match(x)
    assert ok == [] and str(near.ref) == 'gemm.float<bf16>.no_bias' and diff == ['C must be absent']

def test_nbytes_packing():
    assert [nbytes('i4', 1), nbytes('i4', 2), nbytes('i4', 7), nbytes('f32', 3)] == [1, 1, 4, 12]

# ---------------- devices ----------------
def resolve(src, name):
    ws = load(text=src, name='d.nem', base_dir=NEM); ds = DeviceSet(ws)
    return ds.resolve(name), ws.diags + ds.diags

def test_spec_devices_resolve():
    for f, name, eng, l2, l1, ext in [('npm_lite.nem', 'npm_lite', 1, 1048576, 524288, 0), ('npm_mid.nem', 'npm_mid', 2, 4194304, 1048576,
                                                                                            0),
                                      ('npm_pro.nem', 'npm_pro', 4, 8388608, 1048576, 1), ('npm_pro_x1.nem', 'npm_pro_x1', 4, 8388608,
                                                                                           1048576, 3)]:
        ws = load(NEM / 'devices' / f); ds = DeviceSet(ws); rd = ds.resolve(name)
        assert ws.diags == [] and ds.diags == []
        t = rd.topology
        assert (t['num_engines'], t['l2_size_bytes'], t['l1_size_bytes'], len(rd.extended)) == (eng, l2, l1, ext)
        assert rd.spec_version == '1.0' and set(must_variants()) <= set(rd.mandatory)

def test_lite_effective_set():
    ws = load(NEM / 'devices' / 'npm_lite.nem'); rd = DeviceSet(ws).resolve('npm_lite')
    assert sorted(map(str, rd.effective('relu'))) == ['eltwise<bf16>.default', 'eltwise<f16>.default', 'eltwise<i8>.default']
    assert rd.unit_chars == {'NMU': {'int8_macs': 4096, 'fp16_macs': 2048}, 'SEQ': {'max_active_tokens': 16}}
    assert rd.topology['device_units'] == {'sDMA': 1, 'WDM': 0}

BASE = 'include "nem_baseline_1.0.nem"\n'
TOPO = 'topology { num_engines = 1 l2_size_bytes = 100 per_engine { NMU = 1 l1_size_bytes = 10 } }'

def test_inheritance_topology_replaced_chars_merged_sets_unioned():
    src = BASE + f'device a extends nem_baseline_1_0 {{ {TOPO} unit_characteristics {{ NMU {{ x = 1 y = 2 }} }} opcode.extended {{ view<f32>.default }} }}\n' \
          'device b extends a { topology { num_engines = 2 l2_size_bytes = 200 per_engine { CSTL = 3 l1_size_bytes = 20 } }\n' \
          ' unit_characteristics { NMU { y = 5 } VPU { lanes = 8 } } opcode.extended { softmax<f32>.default } }\n'
    rd, diags = resolve(src, 'b')
    assert diags == []
    assert rd.topology['per_engine'] == {'CSTL': 3} and rd.topology['num_engines'] == 2
    assert rd.unit_chars == {'NMU': {'x': 1, 'y': 5}, 'VPU': {'lanes': 8}}
    assert [str(r) for r in rd.extended] == ['view<f32>.default', 'softmax<f32>.default']
    assert rd.chain == ['b', 'a', 'nem_baseline_1_0']

DEVICE_ERRORS = [
    # (source, device, rule, line, words)
    (BASE + 'device a extends nem_baseline_1_0 {\n spec_version = "1.0"\n' + TOPO + ' }', 'a', 'device.derived-spec-version', 3,
     ['must not set spec_version']),
    ('device a {\n opcode.mandatory { cast.default } }', 'a', 'device.spec-version', 1, ['lacks spec_version']),
    ('device a { spec_version = "2.7"\n opcode.mandatory { cast.default } }', 'a', 'device.spec-version', 1, ["'2.7'"]),
    (BASE + 'device a extends nope { }', 'a', 'device.parent', 2, ["extends 'nope'"]),
    (BASE + 'device a extends b { }\ndevice b extends nem_baseline_1_0 { }', 'a', 'device.parent', 2, ['defined after it']),
    (BASE + 'device a extends nem_baseline_1_0 {\n topology { num_engines = 0 l2_size_bytes = 100 per_engine { NMU = 1 l1_size_bytes = '
     '10 } } }', 'a', 'device.counts', 3, ['num_engines = 0']),
    (BASE + 'device a extends nem_baseline_1_0 {\n topology { num_engines = 1 l2_size_bytes = 0 per_engine { NMU = 1 l1_size_bytes = '
     '10 } } }', 'a', 'device.counts', 3, ['l2_size_bytes = 0']),
    (BASE + 'device a extends nem_baseline_1_0 {\n topology { num_engines = 1 l2_size_bytes = 10 per_engine {\n CSTL = 0 l1_size_bytes = '
     '10 } } }', 'a', 'device.counts', 4, ['CSTL = 0']),
    (BASE + 'device a extends nem_baseline_1_0 {\n topology { num_engines = 1 l2_size_bytes = 10 per_engine {\n sDMA = 1 l1_size_bytes = '
     '10 } } }', 'a', 'device.unit-scope', 4, ['sDMA', 'device_units']),
    (BASE + 'device a extends nem_baseline_1_0 {\n topology { num_engines = 1 l2_size_bytes = 10 device_units {\n NMU = 1 } per_engine { '
     'l1_size_bytes = 10 } } }', 'a', 'device.unit-scope', 4, ['NMU', 'per_engine']),
    (BASE + 'device a extends nem_baseline_1_0 { ' + TOPO + '\n opcode.mandatory { gemm.float<f64>.no_bias } }', 'a',
     'device.unknown-variant', 3, []),
    (BASE + 'device a extends nem_baseline_1_0 { ' + TOPO + '\n opcode.extended { gemm.float<f16>.nobias } }', 'a',
     'device.unknown-variant', 3, ['no type family defines', 'did you mean gemm.float<f16>.no_bias']),
    ('include "nem_baseline_1.0.nem"\ndevice a {\n spec_version = "1.0" ' + TOPO + ' opcode.mandatory { cast.default } }', 'a',
     'device.missing-must', 2, ['gemm.int8<i8>.no_bias', 'schema rule 7']),
    ('device a { spec_version = "1.0" ' + TOPO + '\n opcode.mandatory { } }', 'a', 'device.mandatory', 1, ['non-empty']),
    # second cases for the rules above that had one
    (BASE + 'device a extends nem_baseline_1_0 { ' + TOPO + ' }\ndevice b extends a {\n\n spec_version = "1.0" }', 'b',
     'device.derived-spec-version', 5, ["inherits '1.0' from a"]),
    ('device a { spec_version = "1.0" ' + TOPO + ' }', 'a', 'device.mandatory', 1, ['schema rule 2']),
    ('device a {\n spec_version = "1.0" ' + TOPO + ' opcode.mandatory { gemm.int8<i8>.no_bias } }', 'a', 'device.missing-must', 1,
     ['missing: ', 'cast', 'include "nem_baseline_1.0.nem"']),
    (BASE + 'device a extends nem_baseline_1_0 { ' + TOPO + '\n opcode.extended {\n relu<f16>.default } }', 'a', 'device.unknown-variant',
     4, ['relu<f16>.default', 'no type family defines']),
    (BASE + 'device a extends nem_baseline_1_0 {\n topology { num_engines = 4 / 0 l2_size_bytes = 10 per_engine { l1_size_bytes = '
     '10 } } }', 'a', 'device.value', 3, ['num_engines of device a', 'division by zero']),
    (BASE + 'device a extends nem_baseline_1_0 {\n topology { num_engines = 1 l2_size_bytes = 10 per_engine {\n NMU = n l1_size_bytes = '
     '10 } } }', 'a', 'device.value', 4, ["NMU of device a", "unknown name 'n'"]),
    (BASE + 'device a extends nem_baseline_1_0 {\n topology { num_engines = 1 l2_size_bytes = 3037000500 * 3037000500 per_engine { '
     'l1_size_bytes = 10 } } }', 'a', 'device.value', 3, ['l2_size_bytes', '64-bit']),
]

@pytest.mark.parametrize('src,name,rule,line,words', DEVICE_ERRORS)
def test_device_errors(src, name, rule, line, words):
    if 'gemm.float<f64>' in src:   # f64 is not an element type: a syntax error at the reference
        ws = load(text=src, name='d.nem', base_dir=NEM)
        assert [(d.rule, d.line) for d in ws.diags] == [('syntax', line)] and "unknown element type 'f64'" in ws.diags[0].message
        return
    rd, diags = resolve(src, name)
    hits = [d for d in diags if d.rule == rule and d.line == line and d.severity == 'error']
    assert hits, [(d.rule, d.line, d.message) for d in diags]
    text = hits[0].message + ' ' + ' '.join(hits[0].notes)
    for w in words: assert w in text, text

def test_duplicate_entries_warn_and_are_ignored():
    src = BASE + 'device a extends nem_baseline_1_0 { ' + TOPO + '\n opcode.mandatory { view<f32>.default\n view<f32>.default }\n opcode.extended { view<f32>.default } }'
    rd, diags = resolve(src, 'a')
    assert sorted((d.severity, d.rule, d.line) for d in diags) == [('warning', 'device.duplicate', 4), ('warning', 'device.duplicate', 5)]
    assert rd.extended == [] and [str(r) for r in rd.mandatory].count('view<f32>.default') == 1

def test_unknown_unit_characteristics_group_warns():
    for grp, line in (('FOO', 3), ('L1', 4)):
        src = BASE + 'device a extends nem_baseline_1_0 { ' + TOPO + '\n' + '\n' * (line - 3) + ' unit_characteristics { ' + grp + ' { x = 1 } } }'
        rd, diags = resolve(src, 'a')
        assert [(d.severity, d.rule, d.line) for d in diags] == [('warning', 'device.unit-chars', line)]
        assert f"group '{grp}'" in diags[0].message and rd.unit_chars[grp] == {'x': 1}

def test_abstract_derived_device_cannot_be_target():
    r = check(text='include "nem_baseline_1.0.nem"\ndevice mid extends nem_baseline_1_0 { }\n\nconst a = 1\n', name='p.nem', base_dir=NEM)
    assert [(d.rule, d.line) for d in r.errors] == [('device.topology', 2)] and 'no topology after inheritance' in r.errors[0].message

def test_include_not_found_in_checked_program():
    r = check(text='include "devices/npm_lit.nem"\nconst a = 1\n', name='p.nem', base_dir=NEM)
    assert [(d.rule, d.line, d.col) for d in r.errors] == [('include.not-found', 1, 1)] and "'devices/npm_lit.nem'" in r.errors[0].message

def test_abstract_device_cannot_be_target():
    r = check(text='include "nem_baseline_1.0.nem"\ndevice nem_baseline_1_0\nconst a = 1\n', name='p.nem', base_dir=NEM)
    assert [(d.rule, d.line) for d in r.errors] == [('device.topology', 2)] and 'abstract' in r.errors[0].message

def test_unknown_device_directive():
    r = check(text='include "devices/npm_lite.nem"\ndevice npm_max\nconst a = 1\n', name='p.nem', base_dir=NEM)
    assert [(d.rule, d.line) for d in r.errors] == [('device.unknown', 2)] and "'npm_max'" in r.errors[0].message

def test_device_string_directive_and_inline(tmp_path):
    (tmp_path / 'dev.nem').write_text('include "nem_baseline_1.0.nem"\ndevice mine extends nem_baseline_1_0 { ' + TOPO + ' }\n')
    (tmp_path / 'p.nem').write_text('device "dev.nem"\nbuffer B : L2 (size=101)\n')
    r = check(tmp_path / 'p.nem', name='p.nem')
    assert r.device.name == 'mine' and [(d.rule, d.line) for d in r.errors] == [('memory.capacity', 2)]
    r = check(text=BASE + 'device inl extends nem_baseline_1_0 { ' + TOPO + ' }\nprogram p:\nbuffer B : L1[1] (size=4)\n', name='q.nem',
              base_dir=NEM)
    assert r.device.name == 'inl' and [(d.rule, d.line) for d in r.errors] == [('buffer.level', 4)]

def test_device_file_overrides_same_named_device(tmp_path):
    """A device file's own device replaces a same-named device of the program's includes, whether the file is named by
    `device "file"` or by check(device=FILE) (one Workspace.add_device_file for both)."""
    big, small = TOPO.replace('l2_size_bytes = 100', 'l2_size_bytes = 1000'), TOPO
    assert big != small
    (tmp_path / 'inc.nem').write_text('include "nem_baseline_1.0.nem"\ndevice twin extends nem_baseline_1_0 { ' + big + ' }\n')
    (tmp_path / 'dev.nem').write_text('include "nem_baseline_1.0.nem"\ndevice twin extends nem_baseline_1_0 { ' + small + ' }\n')
    (tmp_path / 'p.nem').write_text('include "inc.nem"\ndevice "dev.nem"\nbuffer B : L2 (size=101)\n')
    r = check(tmp_path / 'p.nem', name='p.nem')      # dev.nem's twin (100 bytes of L2) wins over inc.nem's (1000)
    assert r.device.name == 'twin' and r.device.topology['l2_size_bytes'] == 100
    assert [(d.rule, d.line) for d in r.errors] == [('memory.capacity', 3)]
    (tmp_path / 'q.nem').write_text('include "inc.nem"\ndevice twin\nbuffer B : L2 (size=101)\n')
    assert check(tmp_path / 'q.nem', name='q.nem').errors == []                       # inc.nem's twin: 1000 bytes
    r = check(tmp_path / 'q.nem', name='q.nem', device=str(tmp_path / 'dev.nem'))     # --device FILE overrides it
    assert r.device.topology['l2_size_bytes'] == 100 and [(d.rule, d.line) for d in r.errors] == [('memory.capacity', 3)]
    r = check(tmp_path / 'q.nem', name='q.nem', device='twin')                        # --device NAME: the included twin
    assert r.device.topology['l2_size_bytes'] == 1000 and r.errors == []

# ---------------- the spec's worked examples (decision NEM 9) ----------------
def test_conv2d_relu_example_errors():
    r = check(NEM / 'examples' / 'conv2d_relu.nem', name='conv2d_relu.nem')
    # the type error points at the opcode (column 10), the shape error at the output operand C (column 58)
    assert [(d.rule, d.line, d.col) for d in r.errors] == [('type.illegal', 55, 10), ('compute.shape', 55, 58)]
    assert 'declared [1, 14, 14, 128]' in r.errors[1].message and 'gives [1, 16, 16, 128]' in r.errors[1].message
    assert 'conv2d.int8<i8>.with_bias' in r.errors[0].notes[0] and 'X needs a quant descriptor' in r.errors[0].notes[0]
    assert r.warnings == []

def test_conv2d_relu_fixed_clean():
    assert check(NEM / 'examples' / 'conv2d_relu_fixed.nem').diags == []

def test_multi_cstl_degrades_on_lite():
    assert check(NEM / 'examples' / 'multi_cstl.nem').diags == []
    r = check(NEM / 'examples' / 'multi_cstl.nem', device=str(NEM / 'devices' / 'npm_lite.nem'))
    assert r.ok and [(d.severity, d.rule, d.line) for d in r.diags] == [('info', 'deco.resource', 32), ('info', 'deco.resource', 33)]

def test_spec_multifile_example():
    "The spec's multi-file example: its include path is not relative to kernels/, so npm_pro_x1 is not visible."
    r = check(NEM / 'examples' / 'multifile' / 'kernels' / 'matmul.nem', name='matmul.nem')
    assert [(d.rule, d.line) for d in r.errors] == [('device.unknown', 4)]
    assert any('built-in search path' in n for n in r.errors[0].notes)

def test_const_example_clean():
    assert check(NEM / 'examples' / 'const_example.nem').diags == []

# ---------------- CLI ----------------
def test_cli_check_exit_codes_and_carets(monkeypatch):
    monkeypatch.chdir(NEM)
    rc, out, err = run_cli('nem', 'check', 'examples/conv2d_relu.nem')
    assert rc == 1 and out.startswith('examples/conv2d_relu.nem:55:10: error: conv2d(X: i8, W: i8, B: i32 -> Y: i8, accum_type=i32) '
                                      'matches no variant')
    assert '\n    ' + ' ' * 9 + '^\n' in out and '\n    ' + ' ' * 57 + '^\n' in out and '2 error(s)' in out
    rc, out, err = run_cli('nem', 'check', 'examples/conv2d_relu_fixed.nem')
    assert rc == 0

def test_cli_check_json_and_device(monkeypatch):
    monkeypatch.chdir(NEM)
    rc, out, err = run_cli('nem', 'check', 'examples/conv2d_relu.nem', '--json')
    j = json.loads(out)
    assert rc == 1 and j['errors'] == 2 and j['device'] == 'npm_lite' and j['diagnostics'][0]['rule'] == 'type.illegal'
    rc, out, err = run_cli('nem', 'check', 'examples/multi_cstl.nem', '--device', 'nem_baseline_1_0')
    assert rc == 1 and 'abstract' in out
    rc, out, err = run_cli('nem', 'check', 'examples/multi_cstl.nem', '--device', 'npm_nope')
    assert rc == 1 and "device 'npm_nope' is not defined" in err

def test_cli_devices_and_fmt(monkeypatch, tmp_path):
    monkeypatch.chdir(NEM)
    rc, out, err = run_cli('nem', 'devices', 'devices/npm_mid.nem')
    assert rc == 0 and 'device npm_mid  (extends nem_baseline_1_0)' in out and 'int16_macs=1024' in out and 'WDM=2' in out
    rc, out, err = run_cli('nem', 'fmt', 'examples/const_example.nem')
    # (this asserted out.startswith('const TiH = 16'): fmt dropped the file's leading comment, issues #12/#20)
    assert rc == 0 and out.startswith('# The constants example of nem_spec.md') and '\nconst TiH = 16\n' in out
    p = tmp_path / 'f.nem'; p.write_text(out)
    assert run_cli('nem', 'fmt', str(p), '--check')[0] == 0
    p.write_text('const  a=1\n')
    assert run_cli('nem', 'fmt', str(p), '--check')[0] == 1
    p.write_text('const a = (\n')
    rc, out, err = run_cli('nem', 'fmt', str(p))
    assert rc == 1 and ":1:11: error: '(' is never closed" in err

def test_tour(tmp_path, capsys):
    from nac_lab.nem.commands.cli import tour, TOUR_RANK
    tour(tmp_path)
    out = capsys.readouterr().out
    assert TOUR_RANK == 40 and 'type.illegal' in out
    assert (tmp_path / 'nem_devices.svg').is_file() and (tmp_path / 'nem_conv2d_relu_tasks.svg').is_file()

def test_parent_diagnostics_reported_once():
    src = BASE + 'device a extends nem_baseline_1_0 { topology { num_engines = 0 l2_size_bytes = 1 per_engine { NMU = 1 l1_size_bytes = 1 } } }\n' \
          'device b extends a { }\ndevice c extends b { }\n'
    ws = load(text=src, name='d.nem', base_dir=NEM); ds = DeviceSet(ws); res = ds.resolve_all()
    assert [(d.rule, d.line) for d in ds.diags] == [('device.counts', 2)]
    assert res['c'].chain == ['c', 'b', 'a', 'nem_baseline_1_0'] and res['c'].topology['num_engines'] == 0

def test_device_file_that_does_not_parse_is_named(tmp_path):
    # --device FILE with a syntax error used to say only "defines no device", hiding the cause
    from nac_lab.nem.front.lexer import NemError
    (tmp_path / 'bad.nem').write_text('include "nem_baseline_1.0.nem"\ndevice d extends nem_baseline_1_0 {\n  topology {\n')
    with pytest.raises(NemError, match=r"bad\.nem defines no device \(it does not parse: .*bad\.nem:3:12: '\{' is never closed\)"):
        check(text='const a = 1\n', device=str(tmp_path / 'bad.nem'))

def test_cli_unreadable_files_one_line(monkeypatch, tmp_path):
    # binary garbage used to crash `nem fmt` with an internal UnicodeDecodeError (exit 3)
    (tmp_path / 'g.nem').write_bytes(b'const a = 1\n\xff\xfe\x00')
    for cmd in ('check', 'devices', 'fmt'):
        rc, out, err = run_cli('nem', cmd, str(tmp_path / 'g.nem'))
        assert (rc, out) == (1, '') and err.count('\n') == 1, (cmd, rc, err)
        assert 'not UTF-8 text (byte 0xff at offset 12, line 2)' in err
    rc, out, err = run_cli('nem', 'check', str(tmp_path / 'g.nem'), '--json')
    assert rc == 1 and 'Traceback' not in err

def test_cli_json_counts_every_severity():
    rc, out, err = run_cli('nem', 'check', str(data_path('nem', 'examples', 'multi_cstl.nem')), '--device', str(data_path('nem', 'devices',
                                                                                                                          'npm_lite.nem')),
                                                                                                                              '--json')
    j = json.loads(out)
    sev = [d['severity'] for d in j['diagnostics']]
    assert (j['errors'], j['warnings'], j['infos']) == (sev.count('error'), sev.count('warning'), sev.count('info')) == (0, 0, 2)
    assert set(j['diagnostics'][0]) == {'severity', 'rule', 'message', 'file', 'line', 'col', 'notes'}
