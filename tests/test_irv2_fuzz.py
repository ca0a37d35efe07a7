"""Standing fuzz suite for IR v2 JSON (issue #13 item 7).

Seeded, deterministic mutations of the IR v2 inputs -- HuggingFace config values, IR documents (a value
anywhere in the tree replaced by a hostile one) and raw IR text (byte-level edits) -- and, for each case:

* only the project's typed errors (`NacLabError` subclasses) may escape;
* no case may hang (SIGALRM guard per case);
* memory stays bounded: the tracemalloc peak of a case stays under a fixed bound plus a small multiple of
  the input size (a size field of 2**31-1 must not become an allocation);
* an accepted IR generates C whose code outside comments is made only of the generator's own text
  (no input string leaves a comment);
* `irv2 build` / `irv2 emit` on mutated inputs write nothing but the requested output.

Everything is built in memory or with relative paths, so the cases do not depend on the temporary path."""
import copy, json, os, random, re
from pathlib import Path
import pytest
from nac_lab.binio import NacLabError
from nac_lab.cli import run_cli
from nac_lab.core import data_path
from nac_lab.irv2.build import build_ir, validate_ir, load_ir
from nac_lab.irv2.codegen import emit_c
from nac_lab.irv2.maps import Irv2Error

from fuzzguard import Hang, alarm_handler, guarded as _guarded  # noqa: F401 (alarm_handler: an autouse fixture)

def guarded(fn, what, **kw):
    "`fuzzguard.guarded` with this suite's bounds (10 s, 16 << 20 bytes plus 200 per input byte)."
    return _guarded(fn, what, **{'limit_s': 10, 'mem_base': 16 << 20, **kw})

HOSTILE = [None, True, False, 0, -1, 1, 2, 3.0, 2.5, 1e308, float('inf'), 2**31 - 1, 2**31, 2**40, 2**64, 'false', 'x',
           'llama */ int x; /*', '\x00\n#define A', '??/', [], [1], {}, {'dim': 0}, [[[[]]]], 'é' * 40, 64, 16]

def paths(doc, prefix=()):
    "Every (path, value) of a JSON tree, containers included."
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items(): yield from paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc): yield from paths(v, prefix + (i,))

def put(doc, path, value):
    for p in path[:-1]: doc = doc[p]
    doc[path[-1]] = value

@pytest.fixture(scope='module')
def tir():
    return build_ir(data_path('irv2', 'configs', 'tiny-qwen2.json'), ctx=16)

CODE = re.compile(r'/\*.*?\*/', re.S)

def check_accepted(ir, base_code_tokens):
    "An accepted IR generates C; its tokens outside comments come from the generator, not from input strings."
    src = emit_c(ir, 'model')
    code = CODE.sub(' ', src)
    assert '*/' not in code and '??' not in src and src.isascii() and '\x00' not in src
    words = set(re.findall(r'[A-Za-z_][A-Za-z0-9_]*', code))
    assert words <= base_code_tokens, sorted(words - base_code_tokens)[:10]

@pytest.fixture(scope='module')
def base_tokens(tir):
    words = set()
    for name in ('tiny-qwen2.json', 'tiny-llama.json'):
        for ctx in (16, 64):
            words |= set(re.findall(r'[A-Za-z_][A-Za-z0-9_]*', CODE.sub(' ', emit_c(build_ir(data_path('irv2', 'configs', name),
                                                                                             ctx=ctx)))))
    return words

def test_ir_tree_mutations(tir, base_tokens, fuzz_cases):
    rng = random.Random('irv2-fuzz-tree')
    every = list(paths(tir))[1:]
    stats = {'rejected': 0, 'accepted': 0}
    for k in fuzz_cases(range(400), 'ir v2 trees'):
        ir = copy.deepcopy(tir)
        for _ in range(rng.randint(1, 2)):
            p, _ = rng.choice(every)
            try: put(ir, p, copy.deepcopy(rng.choice(HOSTILE)))
            except (KeyError, IndexError, TypeError): pass       # an earlier edit removed the parent
        out = guarded(lambda: (validate_ir(ir), emit_c(ir, 'model')), f'tree case {k}', traced=k % 8 == 0, size=0,
                      mem_base=48 << 20)
        if isinstance(out, NacLabError):
            assert isinstance(out, Irv2Error) and all(ch.isprintable() or ch == '\n' for ch in str(out)), (k, str(out)[:300])
            stats['rejected'] += 1
        else:
            check_accepted(ir, base_tokens); stats['accepted'] += 1
    assert stats['rejected'] > 100 and stats['accepted'] > 10, stats

def test_config_mutations(base_tokens, fuzz_cases):
    base = json.loads(Path(data_path('irv2', 'configs', 'tiny-llama.json')).read_text())
    rng = random.Random('irv2-fuzz-config')
    keys = sorted(base) + ['head_dim', 'n_embd', 'rope_parameters', 'text_config', 'sliding_window', 'qkv_bias']
    accepted = 0
    for k in fuzz_cases(range(400), 'ir v2 configs'):
        c = dict(base)
        for _ in range(rng.randint(1, 3)): c[rng.choice(keys)] = copy.deepcopy(rng.choice(HOSTILE))
        ctx = rng.choice([None, 8, 16])
        out = guarded(lambda: build_ir(c, ctx=ctx), f'config case {k}: {c!r}'[:300], traced=k % 8 == 0, mem_base=48 << 20)
        if isinstance(out, NacLabError):
            assert isinstance(out, Irv2Error), (k, type(out).__name__, str(out)[:200]); continue
        accepted += 1
        assert out['config']['context_length'] <= 2**31 - 1 and out['config']['num_hidden_layers'] <= 4096
        if out['config']['context_length'] <= 4096 and out['config']['dtype'] == 'fp32':
            check_accepted(out, base_tokens)
    assert accepted > 10

def test_ir_text_mutations(tmp_path, tir, fuzz_cases):
    text = json.dumps(tir, indent=1).encode()
    rng = random.Random('irv2-fuzz-text')
    old = os.getcwd(); os.chdir(tmp_path)
    try:
        for k in fuzz_cases(range(200), 'ir v2 texts'):
            b = bytearray(text)
            for _ in range(rng.randint(1, 3)):
                p = rng.randrange(len(b))
                op = rng.randrange(4)
                if op == 0: b[p] = rng.choice(b'{}[]",:0123456789-.eE \n\\tfnu\xff\x00')
                elif op == 1: del b[p:p + rng.randint(1, 40)]
                elif op == 2: b[p:p] = rng.choice([b'[' * 3000, b'9' * 5000, b'NaN', b'1e999', b'"\\u0000"', b'-0', b'{}'])
                else: del b[p:]
            Path('ir.json').write_bytes(bytes(b))
            out = guarded(lambda: load_ir('ir.json'), f'text case {k}', size=len(b), traced=k % 4 == 0, mem_base=48 << 20)
            if isinstance(out, NacLabError): assert isinstance(out, Irv2Error), (k, type(out).__name__, str(out)[:200])
    finally: os.chdir(old)

def test_cli_writes_only_the_output(tmp_path, tir):
    old = os.getcwd(); os.chdir(tmp_path)
    try:
        base = json.loads(Path(data_path('irv2', 'configs', 'tiny-llama.json')).read_text())
        rng = random.Random('irv2-fuzz-cli')
        def snap(): return {str(p): p.read_bytes() for p in sorted(Path('.').rglob('*')) if p.is_file() and p.name not in ('out.json',
                                                                                                                           'out.c')}
        for k in range(20):
            c = dict(base); c[rng.choice(sorted(base))] = rng.choice(HOSTILE)
            Path('cfg.json').write_text(json.dumps(c))
            ir = copy.deepcopy(tir)
            p, _ = rng.choice(list(paths(ir))[1:]); put(ir, p, rng.choice(HOSTILE))
            Path('ir.json').write_text(json.dumps(ir))
            before = snap()
            for argv in (('irv2', 'build', 'cfg.json', '--ctx', '8', '-o', 'out.json'), ('irv2', 'emit', 'ir.json', '-o', 'out.c'),
                         ('irv2', 'info', 'ir.json')):
                rc, out, err = guarded(lambda: run_cli(*argv), f'cli case {k} {argv}', traced=False)
                assert rc in (0, 1) and (rc == 0 or err.count('\n') == 1), (k, argv, err)
            assert snap() == before, k
    finally: os.chdir(old)
