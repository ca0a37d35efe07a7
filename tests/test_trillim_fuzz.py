"""Standing fuzz suite for Trillim files and protocol (issue #13 item 7).

Seeded, deterministic mutations of every Trillim input -- the four binary files (manifest, qmodel.tensors,
rope.cache, qmodel.lora), HuggingFace `config.json` values, `--config` vectors and engine request streams --
and, for each case:

* only the project's typed errors (`NacLabError` subclasses) may escape, nothing else;
* no case may hang (a SIGALRM guard per case);
* memory stays proportional to the input: the tracemalloc peak of a case stays under a fixed bound plus a
  small multiple of the input size, so no count, size or shape read from the input is trusted for an allocation;
* a quantizer run on a mutated checkpoint writes nothing outside the output folder it was given.

All inputs are built with relative paths inside a temporary folder, so the cases are the same whatever the
temporary path (tools/test.sh re-runs this file under a long --basetemp)."""
import io, json, os, random
from pathlib import Path
import numpy as np
import pytest
from nac_lab.binio import NacLabError, FormatError
from nac_lab.cli import run_cli
from nac_lab.trillim.config import ArchConfigError, arch_from_hf, config_args, parse_config_args, load_hf_config
from nac_lab.trillim.manifest import tiny_checkpoint, build_manifest, write_manifest, read_manifest
from nac_lab.trillim.files import quantize, read_tensors, read_rope, read_lora
from nac_lab.trillim.engine import load_model, serve

from trillim_blobs import tiny_trillim_blobs
from fuzzguard import Hang, alarm_handler, guarded as _guarded  # noqa: F401 (alarm_handler: an autouse fixture)

INTERESTING = [0, 1, 2, 7, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0xFFFFFFFF, 2**63 - 1, 2**64 - 1]

def mutate(data: bytes, rng: random.Random) -> bytes:
    "One to three seeded edits: random byte, bit flip, an interesting 16/32/64-bit value, cut, insert, delete, duplicate."
    b = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        if not b: b += bytes([rng.randrange(256)]); continue
        op, p = rng.randrange(7), rng.randrange(len(b))
        if op == 0: b[p] = rng.randrange(256)
        elif op == 1: b[p] ^= 1 << rng.randrange(8)
        elif op == 2:
            w = rng.choice((2, 4, 8)); v = rng.choice(INTERESTING) % (1 << (8 * w))
            b[p:p + w] = v.to_bytes(w, 'little')
        elif op == 3: del b[p:]
        elif op == 4: b[p:p] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 5: del b[p:p + rng.randint(1, 64)]
        else: b[p:p] = b[p:p + rng.randint(1, 64)]
    return bytes(b)

def guarded(fn, what, **kw):
    "`fuzzguard.guarded` with this suite's bounds (5 s, 1 << 20 bytes plus 200 per input byte)."
    return _guarded(fn, what, **{'limit_s': 5, 'mem_base': 1 << 20, **kw})

@pytest.fixture(scope='module')
def blobs(tmp_path_factory): return tiny_trillim_blobs(tmp_path_factory.mktemp('tfuzz'), ('q_proj', 'down_proj'))

def _use_manifest(b):
    m = read_manifest(b)
    assert write_manifest(m) == b            # an accepted manifest is read completely: it writes back to the same bytes
    return m

def _use_tensors(b):
    tf = read_tensors(b)
    for r in tf.records: r.dequant()
    return tf

def _use_rope(b):
    r = read_rope(b); assert np.isfinite(r.cos).all(); return r

def _use_lora(b):
    L = read_lora(b)
    for row in L.slots:
        for s in row:
            if s is not None: assert np.isfinite(s[0]).all() and np.isfinite(s[1]).all()
    return L

READERS = {'manifest': _use_manifest, 'tensors': _use_tensors, 'rope': _use_rope, 'lora': _use_lora}
CASES = 400

@pytest.mark.filterwarnings('ignore::RuntimeWarning')
@pytest.mark.parametrize('kind', sorted(READERS))
def test_binary_file_mutations(blobs, kind, fuzz_cases):
    data, use = blobs[kind], READERS[kind]
    assert not isinstance(use(data), NacLabError)
    rng = random.Random(f'trillim-fuzz-{kind}')
    rejected = 0
    for k in fuzz_cases(range(CASES), f'trillim {kind}'):
        raw = mutate(data, rng)
        out = guarded(lambda: use(raw), f'{kind} case {k}', size=len(raw), traced=k % 4 == 0)
        if isinstance(out, NacLabError):
            assert isinstance(out, FormatError), f'{kind} case {k}: {type(out).__name__}'
            rejected += 1
    assert rejected > CASES // 4

HOSTILE_VALUES = [None, True, False, 0, -1, 1, 3, 2.0, 1e308, -1e308, 2**31, 2**40, 2**64, 10**30, 'false', 'true', '1', '',
                  'x\x00\x1b[2J', [], [1], [True], list(range(20)), {}, {'a': 1}, [[[[]]]], 'é' * 50]
QWEN = dict(model_type='qwen2', architectures=['Qwen2ForCausalLM'], hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=1000, max_position_embeddings=64, rms_norm_eps=1e-6,
            rope_theta=1e6, tie_word_embeddings=True, attention_bias=True, eos_token_id=[3, 7], rope_scaling=None)

def test_config_value_mutations(fuzz_cases):
    rng = random.Random('trillim-fuzz-config')
    keys, accepted = sorted(QWEN), 0
    for k in fuzz_cases(range(1000), 'trillim configs'):
        c = dict(QWEN)
        for _ in range(rng.randint(1, 3)): c[rng.choice(keys)] = rng.choice(HOSTILE_VALUES)
        out = guarded(lambda: arch_from_hf(c), f'config case {k}: {c!r}', mem_base=4 << 20, traced=k % 4 == 0)
        if isinstance(out, NacLabError):
            assert isinstance(out, ArchConfigError) and all(ch.isprintable() for ch in str(out)), (k, str(out))
            continue
        accepted += 1
        # whatever is accepted is what the engine accepts, field for field
        args = config_args(out)
        back = parse_config_args(args)
        assert config_args(back) == args and back.tie_word_embeddings is out.tie_word_embeddings
        assert isinstance(out.tie_word_embeddings, bool) and isinstance(out.has_qkv_bias, bool)
    assert 0 < accepted < 1000

def test_config_vector_mutations(fuzz_cases):
    good = config_args(arch_from_hf(QWEN))
    rng = random.Random('trillim-fuzz-vector')
    tokens = ['0', '1', '-1', '128', '1e5', 'nan', 'inf', '', ' ', '9' * 5000, '0x10', '٣', '1_0', '+1', '2.5']
    for k in fuzz_cases(range(1000), 'trillim config vectors'):
        v = list(good)
        for _ in range(rng.randint(1, 3)):
            op = rng.randrange(3)
            if op == 0 and v: v[rng.randrange(len(v))] = rng.choice(tokens)
            elif op == 1: v.insert(rng.randrange(len(v) + 1), rng.choice(tokens))
            elif v: del v[rng.randrange(len(v))]
        out = guarded(lambda: parse_config_args(v), f'vector case {k}: {v!r}'[:300], traced=k % 4 == 0)
        if not isinstance(out, NacLabError): assert parse_config_args(config_args(out, out.num_threads)) == out

LINES = ['0', '1', '2', '-1', '3', '0.5', '1e-46', '1e308', 'nan', 'inf', '-0', '', ' ', '99999999999999999999', '9' * 2000,
         'é', '\x00', '5 5', '1.0', '40', '63', '64', '1000000']

@pytest.fixture(scope='module')
def engine(tmp_path_factory):
    d = tmp_path_factory.mktemp('tfuzz_engine')
    old = os.getcwd(); os.chdir(d)
    try:
        tiny_checkpoint('m', arch='llama', layers=1, vocab=64, max_pos=24, eos=63)
        cfg = load_hf_config('m')
        quantize(build_manifest('m', None, cfg), cfg, 'm')
        return load_model('m', cfg), cfg
    finally: os.chdir(old)

def test_request_stream_mutations(engine, fuzz_cases):
    model, cfg = engine
    good = ['3', '1', '0.7', '5', '0.9', '1.1', '4', '3', '1', '2', '3']
    rng = random.Random('trillim-fuzz-requests')
    for k in fuzz_cases(range(200), 'trillim requests'):
        v = list(good) + (['2', '0', '0.0', '0', '1.0', '1.0', '0', '2', '5', '6'] if rng.random() < 0.5 else [])
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(3)
            if op == 0: v[rng.randrange(len(v))] = rng.choice(LINES)
            elif op == 1: v.insert(rng.randrange(len(v) + 1), rng.choice(LINES))
            else: del v[rng.randrange(len(v))]
        text = ''.join(x + '\n' for x in v) + ('0\n' if rng.random() < 0.5 else '')
        out, err = io.BytesIO(), io.StringIO()
        rc = guarded(lambda: serve(model, cfg, io.BytesIO(text.encode('utf-8', 'surrogatepass')), out, err, seed=k),
                     f'requests case {k}: {v!r}'[:300], mem_base=64 << 20, traced=k % 10 == 0)
        assert rc in (0, 2), (k, rc)
        lines = out.getvalue().decode().split()
        assert all(x.lstrip('-').isdigit() for x in lines)
        e = err.getvalue()
        assert (rc == 0) == (e == '') and e.count('\n') <= 1 and all(ch.isprintable() for ch in e.strip()), (k, e)

def test_quantize_writes_only_its_output(tmp_path):
    "Mutated checkpoint configs through `trillim quantize -o out`: typed one-line errors, and no file outside out/ changes."
    old = os.getcwd(); os.chdir(tmp_path)
    try:
        tiny_checkpoint('m', arch='llama', layers=1, vocab=64, max_pos=16, eos=63)
        base = json.loads(Path('m/config.json').read_text())
        rng = random.Random('trillim-fuzz-quantize')
        def snap(): return {str(p): p.read_bytes() for p in sorted(Path('.').rglob('*')) if p.is_file() and p.parts[0] != 'out'}
        for k in range(15):
            c = dict(base)
            for _ in range(rng.randint(1, 2)): c[rng.choice(sorted(base))] = rng.choice(HOSTILE_VALUES)
            Path('m/config.json').write_text(json.dumps(c))
            before = snap()
            r = guarded(lambda: run_cli('trillim', 'quantize', 'm', '-o', 'out'), f'quantize case {k}', limit_s=30, traced=False)
            rc, out, err = r
            assert rc in (0, 1) and (rc == 0 or err.count('\n') == 1), (k, rc, err)
            assert snap() == before, k
            assert all(p.name in ('qmodel.tensors', 'rope.cache',
                                  'qmodel.manifest') for p in Path('out').glob('*')) if Path('out').exists() else True
    finally: os.chdir(old)
