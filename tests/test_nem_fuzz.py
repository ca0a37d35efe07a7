"""NEM front end robustness: mutated programs never crash the parser or the checker.

Random single-character edits (delete, duplicate, replace with a grammar character) of the bundled
examples either parse or raise NemSyntaxError with a position inside the text; the checker never raises,
it reports diagnostics.
"""
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from nac_lab.core import data_path
from nac_lab.nem.lexer import NemSyntaxError
from nac_lab.nem.parser import parse
from nac_lab.nem.check import check

SOURCES = [data_path('nem', 'examples', f).read_text() for f in ('conv2d_relu.nem', 'multi_cstl.nem', 'const_example.nem')] + \
          [data_path('nem', 'devices', 'npm_pro.nem').read_text()]
CHARS = list('()[]{},=:;@<>+-*/."#\n 0123456789') + ['loop ', 'endloop', 'region', 'deps=[x]', '@resource(SEQ[0])', 'elem=i4', 'mod', '1.5', 'L1[9]']

@st.composite
def mutated(draw):
    src = draw(st.sampled_from(SOURCES))
    n = draw(st.integers(1, 4))
    for _ in range(n):
        i = draw(st.integers(0, len(src)))
        op = draw(st.sampled_from(['del', 'ins', 'dup']))
        if op == 'del': src = src[:i] + src[i + 1:]
        elif op == 'ins': src = src[:i] + draw(st.sampled_from(CHARS)) + src[i:]
        else: j = min(len(src), i + draw(st.integers(1, 40))); src = src[:j] + src[i:j] + src[j:]
    return src

@given(mutated())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mutations_never_crash(src):
    try:
        parse(src, 'm.nem')
    except NemSyntaxError as ex:
        lines = src.split('\n')
        assert 1 <= ex.line <= len(lines) + 1 and ex.col >= 1
    r = check(text=src, name='m.nem', base_dir=data_path('nem', 'examples'))
    for d in r.diags:
        assert d.severity in ('error', 'warning', 'info') and d.rule and d.message
    r.format()

@pytest.mark.parametrize('src', ['', '\n\n', '# only a comment\n', 'program p:\n', ';;;\n', 'const a = 99999999999999999999 * 99999999999999999999\nbuffer B : L2 (size=a)\n',
                                 'loop i in [0..1000000000]:\n  wait(x)\nendloop\n',
                                 ''.join('  ' * k + f'loop i{k} in [0..3]:\n' for k in range(24)) + ''.join('  ' * k + 'endloop\n' for k in reversed(range(24))),
                                 'const a = ' + '(' * 3000 + '1' + ')' * 3000 + '\n', 'buffer B : L2 (size=64)\nR = region(B, 0, 64, elem=i8, shape=[100000000, 100000000, 100000000], layout=ABC)\n'])
def test_edge_inputs(src):
    r = check(text=src, name='e.nem')
    r.format()

def test_long_operator_chain_is_a_syntax_error_not_a_crash():
    # a flat chain parses into a tree as deep as it is long; the recursive passes (eval, fmt, checks)
    # must never meet it: the parser stops at MAX_EXPR_OPS operators with a positioned error
    from nac_lab.nem.parser import MAX_EXPR_OPS
    src = 'buffer B : L2 (size=64)\nconst a = ' + ' + '.join(['1'] * 50000) + '\n'
    r = check(text=src, name='e.nem')
    assert [(d.rule, d.line, d.col) for d in r.errors] == [('syntax', 2, 11 + 4 * MAX_EXPR_OPS + 2)]
    assert 'expression too long' in r.errors[0].message
    assert len(r.format()) < 1000     # the caret line shows a window, not the 200,000-character line

def test_deepest_accepted_expressions_check_and_format():
    # the largest expression the parser accepts, inside parentheses and nested loops, goes through every pass
    from nac_lab.nem.parser import MAX_EXPR_OPS
    from nac_lab.nem.fmt import fmt_text
    e = '(' * 100 + ' + '.join(['0'] * MAX_EXPR_OPS) + ')' * 100
    src = 'buffer B : L2 (size=64)\n' + ''.join(f'loop i{k} in [0..1]:\n' for k in range(60)) + \
          f'R = region(B, {e}, 8)\nt = transfer.async(dst=R, src=region(B, {e} + 32, 8))\n' + 'endloop\n' * 60
    r = check(text=src, name='e.nem')
    assert r.ok, r.format()
    assert fmt_text(fmt_text(src)) == fmt_text(src)

# ---- pathological inputs: each gives a typed, positioned diagnostic, quickly ----
_SQ = 'const a0 = 10\n' + ''.join(f'const a{k+1} = a{k} * a{k}\n' for k in range(60))
PATHOLOGICAL = [
    # (name, source, [(rule, line)] of the errors, words of the first error)
    ('size 10**100', 'buffer B : DDR (size=1' + '0' * 100 + ')\n', [('syntax', 1)], ['101 digits', '64-bit']),
    ('literal of 5000 digits', 'const a = ' + '7' * 5000 + '\n', [('syntax', 1)], ['5000 digits']),
    ('repeated squaring', _SQ, [('const.range', 6)], ['outside the 64-bit integer range']),
    ('size product overflow', 'const K = 4294967296\nbuffer B : DDR (size=K * K)\n', [('expr.range', 2)], ['4294967296 * 4294967296']),
    ('loop bound 10**18', 'buffer B : L2 (size=64)\nloop i in [0..1000000000000000000] @max_in_flight(1000000000000000000):\n'
                          '  t = transfer.async(dst=region(B, 0, 8), src=region(B, 8, 8))\nendloop\n', [('hazard.write', 3)], ['no dependency']),
    ('max_in_flight 10**7', 'buffer B : L2 (size=64)\nloop i in [0..30000000] @max_in_flight(10000000):\n'
                            '  t = transfer.async(dst=region(B, 0, 8), src=region(B, 8, 8), deps=[t])\nendloop\n', [], []),
    ('rank-1000 shape', 'buffer B : L2 (size=64)\nR = region(B, 0, 64, elem=i8, shape=[' + ', '.join(['99999999'] * 1000) + '], layout=C)\n',
     [('region.extent', 2)], ['more than 9223372036854775807 elements']),
    ('reshape to 10**8000 elements', 'buffer B : L2 (size=64)\nX = region(B, 0, 8, elem=i8, shape=[8], layout=C)\nY = region(B, 8, 8, elem=i8, shape=[8], layout=C)\n'
                                     't = reshape.async in X out Y target_shape=[' + ', '.join(['99999999'] * 1000) + ']\n', [('compute.shape', 4)], ['more than 2**63 - 1 elements']),
    ('2000 nested loops', ''.join(f'loop i{k} in [0..1]:\n' for k in range(2000)) + 'endloop\n' * 2000, [('syntax', None)], ['nesting too deep']),   # the line depends on the stack depth left
    ('100000 parentheses', 'const a = ' + '(' * 100000 + '1' + ')' * 100000 + '\n', [('syntax', 1)], ['nesting too deep']),
    ('binary garbage', bytes(range(256)).decode('latin-1') * 8, [('syntax', 1)], ['unexpected character']),
    ('NUL bytes', '\x00' * 64, [('syntax', 1)], ["unexpected character '\\x00'"]),
    ('empty file', '', [], []),
    ('blank lines only', '\n' * 10000, [], []),
    ('line of a million trailing blanks', 'const a = 1' + ' ' * 1000000 + '\nconst b = a\n', [], []),
]

@pytest.mark.parametrize('name,src,errors,words', PATHOLOGICAL, ids=[p[0] for p in PATHOLOGICAL])
def test_pathological_inputs(name, src, errors, words):
    import time
    t0 = time.process_time()
    r = check(text=src, name='p.nem')
    assert [(d.rule, d.line if line else None) for d, (_, line) in zip(r.errors, errors)] == errors and len(r.errors) == len(errors), r.format()[:2000]
    for w in words: assert w in r.errors[0].message, r.errors[0].message
    assert len(r.format()) < 20000
    assert time.process_time() - t0 < 5, name

def test_many_diagnostics_format_linearly():
    # 50,000 diagnostics: formatting splits each source once, not once per diagnostic
    import time
    r = check(text='wait(x)\n' * 50000, name='w.nem')
    t0 = time.process_time()
    out = r.format()
    assert len(r.errors) == 50000 and out.endswith('50000 error(s), 0 warning(s), 0 info(s)')
    assert time.process_time() - t0 < 5

def test_file_level_pathologies(tmp_path):
    from nac_lab.nem.lexer import NemError
    (tmp_path / 'bin.nem').write_bytes(bytes(range(256)))
    with pytest.raises(NemError, match=r'bin.nem: not UTF-8 text \(byte 0x80 at offset 128, line 2\)'):
        check(tmp_path / 'bin.nem', name='bin.nem')
    (tmp_path / 'a.nem').write_text('include "b.nem"\n'); (tmp_path / 'b.nem').write_text('\n\ninclude "a.nem"\n')
    r = check(tmp_path / 'a.nem', name='a.nem')
    assert [(d.rule, d.file.split('/')[-1], d.line) for d in r.errors] == [('include.cycle', 'b.nem', 3)]
    (tmp_path / 'inc.nem').write_text('include "bin.nem"\n')
    with pytest.raises(NemError, match='not UTF-8'):
        check(tmp_path / 'inc.nem', name='inc.nem')

# ---- malformed type families: check() reports family.* diagnostics, it never raises ----
_ELEMS = ['i4', 'i8', 'u8', 'i16', 'f16', 'bf16', 'f32']

@st.composite
def family_text(draw):
    "A type_family declaration built from random pieces: often malformed (wrong arity, types outside a set, unknown bindings)."
    npar = draw(st.integers(0, 2))
    pnames = ['T', 'T_out'][:npar]
    params = [(p, draw(st.lists(st.sampled_from(_ELEMS), min_size=1, max_size=3, unique=True))) for p in pnames]
    typ = st.sampled_from(_ELEMS + pnames + ['absent', 'any_supported', 'U', 'Tx'])
    decl = ', '.join(p + ': {' + ', '.join(ts) + '}' for p, ts in params)
    lines = ['type_family fz' + (f'<{decl}>' if params else '') + ' {']
    lines += [f'    {o}: {draw(typ)}' for o in draw(st.lists(st.sampled_from(['input', 'output', 'X', 'Y']), max_size=3, unique=True))]
    if draw(st.booleans()): lines.append(f'    accum = {draw(st.sampled_from(["f32", "i32", "f64", "wide"]))}')
    if draw(st.booleans()): lines.append(f'    quant = {draw(st.sampled_from(["required", "absent", "maybe", "required on input", "required on Q"]))}')
    lines.append('    variants:')
    for v in draw(st.lists(st.sampled_from(['default', 'no_bias', 'with_bias']), min_size=1, max_size=2, unique=True)):
        ops = ' '.join(f'{o}: {draw(typ)}' for o in draw(st.lists(st.sampled_from(['B', 'C']), max_size=2, unique=True)))
        entries = []
        for _ in range(draw(st.integers(1, 3))):
            inst = draw(st.lists(st.sampled_from(_ELEMS), max_size=3))
            entries.append(draw(st.sampled_from(['MUST', 'MAY'])) + (f' <{", ".join(inst)}>' if inst else ''))
        lines += [f'    {v}: {{ {ops} }}', f'    conformance: {{ {" ".join(entries)} }}']
    lines.append('}')
    return '\n'.join(lines) + '\n', [f'fz<{", ".join(ts[0] for _, ts in params)}>.default' if params else 'fz.default']

@given(family_text())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_malformed_families_never_raise(fam):
    "A config document with a random family and a device listing one of its variants: diagnostics only, each positioned in the text."
    text, refs = fam
    src = 'include "nem_baseline_1.0.nem"\n' + text + 'device m extends nem_baseline_1_0 {\n' \
          '    topology { num_engines = 1 l2_size_bytes = 4096 per_engine { NMU = 1 l1_size_bytes = 1024 } }\n' \
          f'    opcode.extended {{ {" ".join(refs)} }}\n}}\n'
    r = check(text=src, name='f.nem', base_dir=data_path('nem'))
    n = src.count('\n')
    for d in r.diags:
        assert d.severity in ('error', 'warning', 'info') and d.rule and d.message
        if d.file == 'f.nem': assert 1 <= d.line <= n and d.col >= 1, d.format(src.split('\n'))
    fam_errs = [d for d in r.errors if d.rule.startswith('family.')]
    assert all(d.line <= 2 + text.count('\n') for d in fam_errs)          # at the family, not elsewhere
    if fam_errs: assert not any(d.rule == 'device.unknown-variant' for d in r.errors), r.format()   # no cascade
    r.format()

FAM_BAD = [
    'type_family eltwise<T: {f16, f32}> {\n    input: T\n    output: T\n    variants:\n    default: { }\n    conformance: { MUST <f16, f32> }\n}\n',
    'type_family eltwise<T: {f16, f32}> {\n    input: T\n    output: T\n    variants:\n    default: { }\n    conformance: { MAY <i8> }\n}\n',
    'type_family eltwise<T: {f16, f32}> {\n    input: T\n    output: T\n    variants:\n    default: { }\n    conformance: { MAY }\n}\n',
    'type_family eltwise<T: {f16, f32}> {\n    input: U\n    output: T\n    variants:\n    default: { }\n    conformance: { MAY <f16> }\n}\n',
    'type_family eltwise {\n    input: f16\n    output: f16\n    accum = f99\n    quant = required on nothing\n    variants:\n    default: { }\n    conformance: { MUST <f16> }\n}\n',
]

@pytest.mark.parametrize('fam', FAM_BAD)
def test_program_including_a_malformed_family_never_raises(fam, tmp_path):
    "A program that includes a file with a broken family: family.* errors in that file, and no type.illegal cascade on the relu it governs."
    (tmp_path / 'fam.nem').write_text(fam)
    prog = ('include "fam.nem"\nbuffer A : L1 (size=256)\nX = region(A, 0, 128, elem=f16, shape=[64], layout=C)\n'
            'Y = region(A, 128, 64, elem=i8, shape=[64], layout=C)\nt = relu.sync in X out Y\n')
    r = check(text=prog, name='p.nem', base_dir=tmp_path)
    assert r.errors and all(d.rule.startswith('family.') and d.file.endswith('fam.nem') for d in r.errors), r.format()
    r.format()
