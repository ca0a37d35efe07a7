"""NEM front end robustness: mutated programs never crash the parser or the checker.

Random single-character edits (delete, duplicate, replace with a grammar character) of the bundled
examples either parse or raise NemSyntaxError with a position inside the text; the checker never raises,
it reports diagnostics.
"""
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from nac_lab.core import data_path
from nac_lab.nem.front.lexer import NemSyntaxError
from nac_lab.nem.front.parser import parse
from nac_lab.nem.analysis.check import check

SOURCES = [data_path('nem', 'examples', f).read_text() for f in ('conv2d_relu.nem', 'multi_cstl.nem', 'const_example.nem')] + \
          [data_path('nem', 'devices', 'npm_pro.nem').read_text()]
CHARS = list('()[]{},=:;@<>+-*/."#\n 0123456789') + ['loop ', 'endloop', 'region', 'deps=[x]', '@resource(SEQ[0])', 'elem=i4', 'mod',
                                                     '1.5', 'L1[9]']

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

@pytest.mark.parametrize('src', ['', '\n\n', '# only a comment\n', 'program p:\n', ';;;\n',
                                 'const a = 99999999999999999999 * 99999999999999999999\nbuffer B : L2 (size=a)\n',
                                 'loop i in [0..1000000000]:\n  wait(x)\nendloop\n',
                                 ''.join('  ' * k + f'loop i{k} in '
                                         f'[0..3]:\n' for k in range(24)) + ''.join('  ' * k + 'endloop\n' for k in reversed(range(24))),
                                 'const a = ' + '(' * 3000 + '1' + ')' * 3000 + '\n',
                                     'buffer B : L2 (size=64)\nR = region(B, 0, 64, elem=i8, shape=[100000000, 100000000, 100000000], '
                                     'layout=ABC)\n'])
def test_edge_inputs(src):
    r = check(text=src, name='e.nem')
    r.format()

def test_long_operator_chain_is_a_syntax_error_not_a_crash():
    # a flat chain parses into a tree as deep as it is long; the recursive passes (eval, fmt, checks)
    # must never meet it: the parser stops at MAX_EXPR_OPS operators with a positioned error
    from nac_lab.nem.front.parser import MAX_EXPR_OPS
    src = 'buffer B : L2 (size=64)\nconst a = ' + ' + '.join(['1'] * 50000) + '\n'
    r = check(text=src, name='e.nem')
    assert [(d.rule, d.line, d.col) for d in r.errors] == [('syntax', 2, 11 + 4 * MAX_EXPR_OPS + 2)]
    assert 'expression too long' in r.errors[0].message
    assert len(r.format()) < 1000     # the caret line shows a window, not the 200,000-character line

def test_deepest_accepted_expressions_check_and_format():
    # the largest expression the parser accepts, inside parentheses and nested loops, goes through every pass
    from nac_lab.nem.front.parser import MAX_EXPR_OPS
    from nac_lab.nem.front.fmt import fmt_text
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
                          '  t = transfer.async(dst=region(B, 0, 8), src=region(B, 8, 8))\nendloop\n', [('hazard.write', 3)],
                              ['no dependency']),
    ('max_in_flight 10**7', 'buffer B : L2 (size=64)\nloop i in [0..30000000] @max_in_flight(10000000):\n'
                            '  t = transfer.async(dst=region(B, 0, 8), src=region(B, 8, 8), deps=[t])\nendloop\n', [], []),
    ('rank-1000 shape',
     'buffer B : L2 (size=64)\nR = region(B, 0, 64, elem=i8, shape=[' + ', '.join(['99999999'] * 1000) + '], layout=C)\n',
     [('region.extent', 2)], ['more than 9223372036854775807 elements']),
    ('reshape to 10**8000 elements',
     'buffer B : L2 (size=64)\nX = region(B, 0, 8, elem=i8, shape=[8], layout=C)\nY = region(B, 8, 8, elem=i8, shape=[8], layout=C)\n'
                                     't = reshape.async in X out Y target_shape=[' + ', '.join(['99999999'] * 1000) + ']\n',
                                         [('compute.shape', 4)], ['more than 2**63 - 1 elements']),
    ('2000 nested loops', ''.join(f'loop i{k} in [0..1]:\n' for k in range(2000)) + 'endloop\n' * 2000, [('syntax', None)],
     ['nesting too deep']),   # the line depends on the stack depth left
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
    got = [(d.rule, d.line if line else None) for d, (_, line) in zip(r.errors, errors)]
    assert got == errors and len(r.errors) == len(errors), r.format()[:2000]
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
    from nac_lab.nem.front.lexer import NemError
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
    if draw(st.booleans()): lines.append(f'    quant = '
                                         f'{draw(st.sampled_from(["required", "absent", "maybe", "required on input", "required on Q"]))}')
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
    'type_family eltwise<T: {f16, f32}> {\n    input: T\n    output: T\n    variants:\n    default: { }\n    conformance: { MUST <f16, '
    'f32> }\n}\n',
    'type_family eltwise<T: {f16, f32}> {\n    input: T\n    output: T\n    variants:\n    default: { }\n    conformance: { MAY '
    '<i8> }\n}\n',
    'type_family eltwise<T: {f16, f32}> {\n    input: T\n    output: T\n    variants:\n    default: { }\n    conformance: { MAY }\n}\n',
    'type_family eltwise<T: {f16, f32}> {\n    input: U\n    output: T\n    variants:\n    default: { }\n    conformance: { MAY '
    '<f16> }\n}\n',
    'type_family eltwise {\n    input: f16\n    output: f16\n    accum = f99\n    quant = required on nothing\n    variants:\n    '
    'default: { }\n    conformance: { MUST <f16> }\n}\n',
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

# ---- hostile inputs (issue #13): bounded memory, no recursion limits, no echo of other files, escaped control characters ----
import os, re, random, resource, signal, tracemalloc
from contextlib import contextmanager
from nac_lab.nem.front.lexer import NemError, MAX_LINE_CHARS
from nac_lab.nem.front.documents import load
from nac_lab.nem.front.devices import DeviceSet, MAX_DEVICE_DEPTH

RAW_CONTROL = re.compile('[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]')    # anything but the newline that separates lines

@contextmanager
def time_limit(seconds):
    "Fail (instead of hanging) when the body runs longer than `seconds` of wall time."
    def boom(*a): raise TimeoutError(f'over {seconds} s')
    old = signal.signal(signal.SIGALRM, boom); signal.setitimer(signal.ITIMER_REAL, seconds)
    try: yield
    finally: signal.setitimer(signal.ITIMER_REAL, 0); signal.signal(signal.SIGALRM, old)

def test_six_megabyte_const_line_is_bounded():
    "A 6 MB `const` line once cost 770 MB of tokens; now the lexer refuses the line before making any."
    src = 'const a = ' + '1 + ' * 1_500_000 + '1\n'
    tracemalloc.start()
    try:
        with pytest.raises(NemSyntaxError) as ei: parse(src, 'big.nem')
        peak = tracemalloc.get_traced_memory()[1]
    finally: tracemalloc.stop()
    assert (ei.value.line, ei.value.col) == (1, MAX_LINE_CHARS + 1) and 'a NEM line holds at most' in ei.value.msg
    assert peak < 3 * len(src) + (8 << 20), peak           # the text and its split, no tokens
    r = check(text=src, name='big.nem')
    assert r.rules() == ['syntax'] and len(r.format()) < 1000

def test_long_extends_chain(tmp_path):
    "600 devices each extending the previous: no RecursionError; the chain is cut at MAX_DEVICE_DEPTH with a typed diagnostic."
    topo = 'topology { num_engines = 1 l2_size_bytes = 100 per_engine { NMU = 1 l1_size_bytes = 10 } }'
    src = 'include "nem_baseline_1.0.nem"\ndevice d0 extends nem_baseline_1_0 { ' + topo + ' }\n' + \
          ''.join(f'device d{k} extends d{k-1} {{ }}\n' for k in range(1, 600))
    ws = load(text=src, name='chain.nem', base_dir=data_path('nem'))
    ds = DeviceSet(ws)
    with time_limit(20): res = ds.resolve_all()
    deepest = res[f'd{MAX_DEVICE_DEPTH - 2}'].chain
    assert deepest[-1] == 'nem_baseline_1_0' and len(deepest) == MAX_DEVICE_DEPTH
    assert res[f'd{MAX_DEVICE_DEPTH - 1}'] is None and res['d599'] is None
    assert [(d.rule, d.line) for d in ds.diags] == [('device.parent', MAX_DEVICE_DEPTH + 1)] and 'at most 256 deep' in ds.diags[0].message
    cyc = 'include "nem_baseline_1.0.nem"\n' + ''.join(f'device c{k} extends c{(k + 1) % 700} {{ }}\n' for k in range(700))
    ds = DeviceSet(load(text=cyc, name='cyc.nem', base_dir=data_path('nem')))
    with time_limit(20): res = ds.resolve_all()
    assert all(v is None for k, v in res.items() if k.startswith('c'))
    assert [d.message for d in ds.diags if 'itself' in d.message] == ['device c0 extends itself through its parents']

def test_long_include_chain(tmp_path):
    "A chain of 800 files each including the next: loaded iteratively, in linear time; the last file's device is visible."
    n = 800
    for k in range(n - 1): (tmp_path / f'f{k}.nem').write_text(f'include "f{k + 1}.nem"\n')
    (tmp_path / f'f{n - 1}.nem').write_text('include "nem_baseline_1.0.nem"\ndevice deep extends nem_baseline_1_0 { topology { '
                                            'num_engines = 1 l2_size_bytes = 64 per_engine { NMU = 1 l1_size_bytes = 8 } } }\n')
    with time_limit(30): r = check(text='include "f0.nem"\ndevice deep\nbuffer B : L2 (size=65)\n', name='p.nem', base_dir=tmp_path)
    assert r.device.name == 'deep' and r.rules() == ['memory.capacity']
    (tmp_path / f'f{n - 1}.nem').write_text('include "f0.nem"\n')      # and as a cycle: one diagnostic naming the chain
    with time_limit(30): r = check(text='include "f0.nem"\n', name='p.nem', base_dir=tmp_path)
    assert r.rules() == ['include.cycle'] and r.errors[0].message.count(' -> ') == n

@pytest.mark.parametrize('content,words', [
    (b'root:$6$Zm9vYmFy$hashhashhash:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n', 'not NEM text'),   # a shadow-like text file
    (b'HOME=/root\x00SECRET_TOKEN=abc123\x00', 'binary data'),                                     # /proc/self/environ-like
    (b'\x7fELF\x02\x01\x01\x00' + bytes(range(256)), 'not UTF-8'),                                  # a binary
])
def test_including_other_files_never_echoes_them(tmp_path, content, words):
    (tmp_path / 'other').write_bytes(content)
    for src in ('include "other"\nconst a = 1\n', 'device "other"\nconst a = 1\n'):
        try: out = check(text=src, name='p.nem', base_dir=tmp_path).format()
        except NemError as ex: out = str(ex)
        assert words in out, out
        out = out.replace(str(tmp_path), '')
        for secret in ('root', '$6$', 'hash', 'daemon', 'HOME', 'SECRET', 'abc123', 'ELF'): assert secret not in out, (secret, out)

def test_real_system_files_are_not_echoed(tmp_path):
    "The reproducers of issue #13 on the real files, where they exist and are readable."
    for f in ('/etc/shadow', '/etc/passwd', '/proc/self/environ', '/dev/zero', '/dev/null'):
        if not os.path.exists(f): continue
        try: text = open(f, 'rb').read(4096) if not f.startswith('/dev/') else b''
        except OSError: text = b''
        try:
            with time_limit(10): out = check(text=f'include "{f}"\n', name='p.nem').format()
        except NemError as ex: out = str(ex)
        assert out.count('\n') <= 2, out
        for word in re.findall(rb'[A-Za-z_][A-Za-z0-9_]{3,}', text)[:50]:
            assert word.decode() not in out.replace(f, ''), (f, word, out)

def test_fifo_and_devices_are_refused(tmp_path):
    os.mkfifo(tmp_path / 'pipe.nem')
    with time_limit(10):
        with pytest.raises(NemError, match='pipe.nem: not a regular file'): check(text='include "pipe.nem"\n', base_dir=tmp_path)
        with pytest.raises(NemError, match='not a regular file'): check(tmp_path / 'pipe.nem')
        with pytest.raises(NemError, match='/dev/zero: not a regular file'): check(text='include "/dev/zero"\n')

CONTROL_CASES = [
    'y = compute.async(op="\x1b[2J\x1b]0;pwned\x07", in=[X], out=[Y])\n',       # ESC and BEL in a string
    'include "a\x1b[31mb.nem"\n',                                                # in an include path
    'device "\x1b[1mdev\u2028.nem"\nconst a = 1\n',                              # in a device file name, with a line separator
    'const a = 1\x00\nconst b = \x1b\n',                                          # NUL and ESC in the program text
    'buffer B : L2 (size=64)\nt = relu.async in B\r out B\x0b\n',                 # CR and VT inside a statement
    'x = "\u202eevil"\n',                                                         # a bidi override
]

@pytest.mark.parametrize('src', CONTROL_CASES)
def test_control_characters_are_escaped(src):
    r = check(text=src, name='c\x1b.nem')
    out = r.format()
    assert not RAW_CONTROL.search(out), repr(out)
    lines = out.split('\n')
    n = sum(1 + (1 if d.line >= 1 else 0) * 0 + len(d.notes) for d in r.diags)      # a header line per diagnostic, plus notes
    assert len([l for l in lines if ': error: ' in l or ': warning: ' in l or ': info: ' in l]) == len(r.diags), out
    for d in r.diags: assert not RAW_CONTROL.search(d.format(r.ws.sources))
    try: parse(src, 'c\x1b.nem')
    except NemSyntaxError as ex: assert not RAW_CONTROL.search(str(ex)) and str(ex).count('\n') <= 2

def test_cli_messages_are_escaped(tmp_path, capsys):
    from nac_lab.cli import main
    bad = tmp_path / 'b\x1b[31m.nem'
    bad.write_text('const a = "\x1b[2J"\n')
    for cmd in (['nem', 'check', str(bad)], ['nem', 'fmt', str(bad)], ['nem', 'devices', str(bad)], ['nem', 'check',
                                                                                                     str(tmp_path / 'no\x1bne.nem')]):
        try: main(cmd)
        except SystemExit: pass
        cap = capsys.readouterr()
        assert not RAW_CONTROL.search(cap.out + cap.err), (cmd, cap)

@pytest.mark.parametrize('value,rule,words', [
    ('max_active_tokens = true', 'device.value', "unknown name 'true'; device values are integer literals"),
    ('max_active_tokens = false', 'device.value', 'no booleans'),
    ('max_active_tokens = 1.5', 'device.value', 'FLOAT literal 1.5'),
    ('max_active_tokens = "16"', 'syntax', 'expected an expression'),
    ('max_active_tokens = "false"', 'syntax', 'expected an expression'),
])
def test_device_values_are_strictly_typed(value, rule, words):
    "Device fields are integers: a boolean word, a FLOAT or a string (\"false\") is an error, never coerced."
    src = ('include "nem_baseline_1.0.nem"\ndevice d extends nem_baseline_1_0 {\n'
           '  topology { num_engines = 1 l2_size_bytes = 64 per_engine { NMU = 1 l1_size_bytes = 8 } }\n'
           f'  unit_characteristics {{ SEQ {{ {value} }} }}\n}}\n')
    r = check(text=src, name='d.nem', base_dir=data_path('nem'))
    assert [(d.rule, d.line) for d in r.errors] == [(rule, 4)] and words in r.errors[0].message, r.format()
    for field in ('num_engines = true', 'num_engines = "1"', 'l2_size_bytes = 64.0'):
        r = check(text=src.replace('num_engines = 1', field).replace(value, 'max_active_tokens = 4'), name='d.nem',
                  base_dir=data_path('nem'))
        assert r.errors and r.errors[0].rule in ('device.value', 'syntax') and r.errors[0].line == 3, r.format()
    r = check(text='include "nem_baseline_1.0.nem"\ndevice d extends nem_baseline_1_0 { spec_version = 1.0 }\n', name='d.nem',
              base_dir=data_path('nem'))
    assert r.rules() == ['syntax'] and 'a string such as "1.0"' in r.errors[0].message

# ---- the standing fuzz test: deterministic seeds, a time alarm, bounded memory ----
_VOCAB = ['const', 'let', 'buffer', 'region', 'loop', 'endloop', 'in', 'out', 'wait', 'transfer.async', 'store.sync', 'relu.async',
          'gemm.sync', 'conv2d.async', 'device', 'include', 'program', 'type_family', 'extends', 'topology', 'per_engine',
          'opcode.mandatory', 'variants:', 'conformance:', 'MUST', 'MAY', 'deps=[', 'elem=f16', 'shape=[', 'layout=NC', 'strides=[',
          'quant=per_tensor(scale=1.0, zero_point=0)', '@readonly', '@max_in_flight(', '@resource(NMU[', '@memmove', '@import',
          'L1', 'L2', 'DDR', 'L1[', 'size=', 'align=', 'mod', '..', '(', ')', '[', ']', '{', '}', ',', '=', ':', ';', '+', '-', '*', '/',
          '0', '1', '64', '9223372036854775807', '1.5', '"x.nem"', '"devices/npm_lite.nem"', '"\x1b"', '\n', '\n', '\n', '    ', '#c\n',
          'A', 'B', 'X', 'Y', 't', 'i', '\x00', '\r', '\u2028', 'é']

def _fuzz_text(rng):
    "A random NEM-ish text: a bundled example mutated, or a soup of NEM words."
    if rng.random() < 0.5:
        src = rng.choice(SOURCES)
        for _ in range(rng.randrange(1, 12)):
            i = rng.randrange(0, len(src) + 1); j = min(len(src), i + rng.randrange(0, 60))
            op = rng.random()
            if op < 0.3: src = src[:i] + src[j:]
            elif op < 0.6: src = src[:i] + rng.choice(_VOCAB) + src[i:]
            elif op < 0.8: src = src[:j] + src[i:j] * rng.randrange(1, 20) + src[j:]
            else: src = src[:i] + chr(rng.randrange(0, 0x3000)) + src[i:]
        return src
    return ' '.join(rng.choice(_VOCAB) for _ in range(rng.randrange(1, 400)))

def test_standing_fuzz(fuzz_cases):
    "400 seeded random texts through parse, check and fmt: only typed errors, each case well under its time alarm, memory growth bounded."
    from nac_lab.nem.front.fmt import fmt_text
    rng = random.Random(20260413)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with time_limit(120):
        for case in fuzz_cases(range(400), 'nem texts'):
            src = _fuzz_text(rng)
            try: parse(src, 'z.nem')
            except NemSyntaxError as ex: assert ex.line >= 1 and ex.col >= 1 and not RAW_CONTROL.search(str(ex))
            try: r = check(text=src, name='z.nem', base_dir=data_path('nem', 'examples'))
            except NemError as ex: assert not RAW_CONTROL.search(str(ex)); continue
            out = r.format()
            assert not RAW_CONTROL.search(out), (case, repr(src)[:300])
            for d in r.diags: assert d.severity in ('error', 'warning', 'info') and d.rule and d.message
            try: fmt_text(src, 'z.nem')
            except NemError: pass
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 512 * 1024      # KiB: the run grew the process by less than 512 MB

# --- loop bounds (#28 item 10): the up-front estimate bounds what the unroll makes, and refusals name a loop -----------------------
from nac_lab.nem.execution.elab import elaborate, load_program, check_instances
from nac_lab.nem.execution.memory import NemExecError
from nac_lab.nem.timing.table import build_table

BOUNDS = ['[0..0]', '[0..1]', '[0..9]', '[1..3]', '[0..99]', '[5..2]', '[0..N]', '[0..N * N]', '[0..1000000]', '[0..1000000000]']

def loop_program(rng) -> tuple:
    "A device program of 1-6 loops, nested or in sequence, with constant, empty, const-derived and outer-variable-dependent bounds."
    lines, loops, depth = ['const N = 12', 'buffer A : L2 (size=64)', 'buffer B : L2 (size=64)'], [], 0
    for k in range(rng.randrange(1, 7)):
        b = rng.choice(BOUNDS + ([f'[0..v{depth - 1}]', f'[v{depth - 1}..20]'] if depth else []))
        loops.append(len(lines) + 4)                                  # its line number, after the three header lines below
        lines.append('  ' * depth + f'loop v{depth} in {b}:'); depth += 1
        if rng.random() < 0.6: lines.append('  ' * depth + rng.choice(['t = transfer.sync(dst=region(B, 0, 64), src=region(A, 0, 64))',
                                                                          'let z = 1']))
        if depth > 1 and rng.random() < 0.3: depth -= 1; lines.append('  ' * depth + 'endloop')
    while depth: depth -= 1; lines.append('  ' * depth + 'endloop')
    head = f'include "{data_path("nem", "devices", "npm_lite.nem")}"\ndevice npm_lite\nprogram p:\n'
    return head + '\n'.join(lines) + '\n', loops

def test_loop_bound_fuzz(fuzz_cases):
    rng, kinds, limit = random.Random(10), {}, 3000
    for k in fuzz_cases(range(150), 'NEM loop bounds'):
        src, loops = loop_program(rng)
        cr = load_program(src)
        if not cr.ok: kinds['check'] = kinds.get('check', 0) + 1; continue
        est = check_instances(cr.program.body, {'N': 12}, 10**60, 'f')
        try:
            el = elaborate(cr, max_instances=limit)
            tb = build_table(cr, max_instances=limit)
        except NemExecError as ex:
            assert ex.rule == 'exec.limit' and est > limit, (ex, est)
            assert ex.line in loops or ex.line == 0, (ex.line, loops, src)
            kinds['refused'] = kinds.get('refused', 0) + 1; continue
        assert len(el.insts) <= est and tb.n <= est, (len(el.insts), tb.n, est, src)      # the estimate is an upper bound
        kinds['ok'] = kinds.get('ok', 0) + 1
    assert kinds.get('ok', 0) >= 30 and kinds.get('refused', 0) >= 30, kinds
