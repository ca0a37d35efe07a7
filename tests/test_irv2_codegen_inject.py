"""No text from an IR v2 file can become code in the generated C (issue #13 item 1).

The generator writes input strings only into comments (model type, op, condition, file name), through
`c_comment`. These tests read the generated source the way a C compiler does -- trigraphs (gcc enables them
with -std=c11), line splices, then comments and string/char literals -- and check that:

* the code outside comments and literals is exactly that of a benign IR with the same numbers, whatever the
  strings are (so no input string can add a declaration, a preprocessor line or a call);
* every comment that differs from the benign one holds only `c_comment`'s whitelisted characters;
* an op that is not an op of the kernel maps is refused at load with a typed error (escaped in the message).

The strings are built from pieces designed to leave a C comment or literal, combined by a seeded RNG.
The reproducer of the issue runs through the real CLI and must not create its marker file."""
import copy, json, os, random, re, subprocess, sys
import pytest
from nac_lab.binio import NacLabError
from nac_lab.core import data_path
from nac_lab.irv2.build import build_ir, save_ir, validate_ir
from nac_lab.irv2.codegen import emit_c, c_comment, emit_file
from nac_lab.irv2.maps import IrError
from nac_lab.irv2.run import random_weights, save_weights

TRIGRAPHS = {'=': '#', '(': '[', '/': '\\', ')': ']', "'": '^', '<': '{', '!': '|', '>': '}', '-': '~'}
SAFE = set('ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789 _.,:;=+-()[]{}<>|!&^~@$%')

def c_phases(src: str) -> str:
    "Translation phases 1-2 as gcc -std=c11 does them: trigraph replacement, then backslash-newline splicing."
    for k, v in TRIGRAPHS.items(): src = src.replace('??' + k, v)
    return src.replace('\\\n', '')

def split_c(src: str):
    "`(code, comments)`: the source with each comment replaced by one space, and the list of comment bodies."
    src = c_phases(src)
    code, comments, i, n = [], [], 0, len(src)
    while i < n:
        if src.startswith('/*', i):
            j = src.find('*/', i + 2)
            assert j >= 0, 'unterminated comment'
            comments.append(src[i + 2:j]); code.append(' '); i = j + 2
        elif src.startswith('//', i):
            j = src.find('\n', i)
            j = n if j < 0 else j
            comments.append(src[i + 2:j]); code.append(' '); i = j
        elif src[i] in '"\'':
            q, j = src[i], i + 1
            while j < n and src[j] != q:
                assert src[j] != '\n', 'newline inside a literal'
                j += 2 if src[j] == '\\' else 1
            code.append(src[i:j + 1]); i = j + 1
        else:
            code.append(src[i]); i += 1
    return ''.join(code), comments

PIECES = ['*/', '/*', '//', '\n', '\r', '"', "'", '\\', '\\\n', '??/', '??/\n', '*??/\n/', '*\\\n/', '\x00', '\x1b', 'é',
          '\u2028', '\U0001f600', '#', '\n#define nac_init evil\n', '\n#include "/etc/passwd"\n', 'int system(const char *);',
          '__attribute__((constructor)) static void p(void){ if(system("touch X")){} }', '%', '%2A%2F', 'llama', ' ', '}']
ISSUE = 'llama */ int system(const char *); __attribute__((constructor)) static void p(void){ if(system("touch X")){} } /*'

def fuzz_strings(n=60, seed=13):
    rng = random.Random(seed)
    out = [ISSUE] + PIECES
    for _ in range(n): out.append(''.join(rng.choice(PIECES) for _ in range(rng.randint(1, 6))))
    return out

@pytest.fixture(scope='module')
def tir():
    return build_ir(data_path('irv2', 'configs', 'tiny-llama.json'), ctx=16)

def test_lexer_sees_a_breakout():
    # the checker itself: the unsanitized text of the issue would change the code outside comments
    base = '/* model_type llama */\nint x;\n'
    code0, _ = split_c(base)
    code1, _ = split_c(base.replace('llama', ISSUE))
    assert code1 != code0 and 'system' in code1
    assert split_c('/* a *??/\n/ int y; */')[0] != ' '          # a trigraph backslash splices '*/' together

MARK = 'QQmarkQQ'
SAFE_RUN = '[' + re.escape(''.join(sorted(SAFE))) + ']*'

def emit_with(tir, field, s):
    ir = copy.deepcopy(tir)
    if field == 'model_type': ir['config']['model_type'] = s; return emit_c(ir, 'model')
    if field == 'condition':
        for n in ir['nodes']:
            if n['op'] == 'rope': n['condition'] = s
        return emit_c(ir, 'model')
    return emit_c(ir, s)

def check_like_baseline(src, base_code, base_comments, what, mark=MARK):
    "Code outside comments identical to the baseline; each comment the baseline's with its marker replaced by safe text."
    code, comments = split_c(src)
    assert code == base_code, f'{what} changed the code outside comments'
    assert len(comments) == len(base_comments), what
    for c, c0 in zip(comments, base_comments):
        if mark not in c0: assert c == c0, what; continue
        pat = SAFE_RUN.join(re.escape(part) for part in c0.split(mark))
        assert re.fullmatch(pat, c, re.S), (what, c)

@pytest.mark.parametrize('field', ['model_type', 'name'])
def test_input_strings_stay_inside_comments(tir, field):
    base = emit_with(tir, field, MARK)
    base_code, base_comments = split_c(base)
    assert sum(MARK in c for c in base_comments) >= 1
    for s in fuzz_strings():
        src = emit_with(tir, field, s)
        check_like_baseline(src, base_code, base_comments, f'{field}={s!r}')
        if len(s) >= 2 and not set(s) <= SAFE and s not in base: assert s not in src, s
        assert '\x00' not in src and src.isascii()

def decode_comment(c: str) -> str:
    "Inverse of c_comment's escapes, written from its documented rule: %XX, %uXXXX, %UXXXXXX."
    out, i = [], 0
    while i < len(c):
        if c[i] != '%': out.append(c[i]); i += 1; continue
        w = {'u': 4, 'U': 6}.get(c[i + 1], 2); j = i + 1 + (w != 2)
        out.append(chr(int(c[j:j + w], 16))); i = j + w
    return ''.join(out)

def test_c_comment_whitelist():
    for s in fuzz_strings():
        c = c_comment(s, limit=10_000)
        assert set(c) <= SAFE and '*/' not in c and '??' not in c
        assert decode_comment(c) == s                      # nothing is lost
    assert c_comment('x' * 101).endswith('...') and len(c_comment('\U0001f600' * 500)) < 1200

def test_unknown_ops_are_refused(tir):
    for s in fuzz_strings(20):
        ir = copy.deepcopy(tir)
        for n in ir['nodes']:
            if n['op'] == 'rope': n['op'] = s
        with pytest.raises(IrError, match='is not an op of the kernel maps') as ei:
            validate_ir(ir)
        msg = str(ei.value)
        assert msg.isascii() and not any(ord(ch) < 32 for ch in msg), msg

def test_conditions_and_names_are_typed_errors(tir):
    # a condition is parsed by a strict grammar (no '*', '/', '#', quotes): either a typed error, or it is valid
    # (blanks, newlines) and then it stays inside its comment; buffer names and kernels are C identifiers by schema
    mark = 'vocab_size'                                  # a name that is true for the config, as the marker
    base_code, base_comments = split_c(emit_with(tir, 'condition', 'rope_theta>0 && ' + mark))
    valid = 0
    for s in fuzz_strings(20):
        cond = 'rope_theta>0 && ' + mark + s
        try: src = emit_with(tir, 'condition', cond)
        except NacLabError: continue
        check_like_baseline(src, base_code, base_comments, f'condition={cond!r}', mark); valid += 1
    assert valid >= 2                                    # e.g. the newline and the blank pieces
    for s in fuzz_strings(20):
        ir = copy.deepcopy(tir); ir['buffers'][1]['name'] = 'x' + s
        with pytest.raises(IrError): validate_ir(ir)
        ir = copy.deepcopy(tir); ir['nodes'][0]['kernel'] = 'embedding_forward' + s
        with pytest.raises(NacLabError): emit_c(ir)

def test_issue_reproducer_through_the_cli(tir, tmp_path):
    ir = copy.deepcopy(tir); ir['config']['model_type'] = ISSUE
    (tmp_path/'evil.json').write_text(json.dumps(ir))
    save_weights(random_weights(tir, seed=3), tmp_path/'w.safetensors')
    env = {**os.environ, 'NAC_LAB_CACHE': str(tmp_path/'cache')}
    cmd = [sys.executable, '-c', 'import sys; from nac_lab.cli import main; sys.exit(main())',
           'irv2', 'run', 'evil.json', 'w.safetensors', '--tokens', '1,2,3', '--steps', '2']
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path/'X').exists()
    save_ir(tir, tmp_path/'good.json')
    r2 = subprocess.run(cmd[:5] + ['good.json'] + cmd[6:], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert r2.returncode == 0 and r.stdout == r2.stdout, (r.stdout, r2.stdout, r2.stderr)
    # emit names the file; the C written for the evil IR has the model type only as %XX text inside a comment
    out = emit_file(tmp_path/'evil.json', tmp_path/'evil.c')
    assert 'system' not in split_c(out.read_text())[0] and 'model_type llama %2A%2F int system(' in out.read_text()
