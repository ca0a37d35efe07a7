"""IR v2 with batch > 1 (`build_ir(..., batch=B)`, `irv2.batch`): B = 3 sequences of different prompt lengths, each
sequence's logits and greedy tokens against the same sequence run alone by the one-sequence runtime and against
HuggingFace transformers; slot reuse, mixed prefill/decode steps, chunked prefill; the memory plan by formula from the
config; typed weights (q8_0, and a GGUF file through the command line); the generated C under AddressSanitizer + UBSan."""
import ctypes, json, os, subprocess, sys
import numpy as np
import pytest
import torch
from nac_lab.binio import NacLabError
from nac_lab.core import data_path
from nac_lab.irv2.batch import BatchRuntime, emit_batch_c
from nac_lab.irv2.build import build_ir, validate_ir
from nac_lab.irv2.maps import CodegenError, ConfigError, IrError, RuntimeFailure
from nac_lab.irv2.run import Runtime, TorchReference, random_weights, save_weights

CONFIGS = ['tiny-llama.json', 'tiny-qwen2.json']
SAME = 1e-5            # batched vs alone: the same operations in the same order (observed: 0)
HF_TOL = 5e-5          # vs transformers: another implementation (observed 1.4e-6 llama, 1.9e-5 qwen2, as the batch-1 runtime)


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp('irv2_batch_cache')


def _prompts(vocab, lengths, seed):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, vocab, n)] for n in lengths]


def _pair(name, tmp, cache, batch=3, ctx=None, seed=0, openmp=False):
    "The batch-B runtime and the one-sequence runtime of the same config and weights."
    ir1, irb = build_ir(data_path('irv2', 'configs', name), ctx=ctx), build_ir(data_path('irv2', 'configs', name), ctx=ctx, batch=batch)
    sd = random_weights(ir1, seed=seed)
    w = save_weights(sd, tmp/'w.safetensors')
    return ir1, sd, Runtime(ir1, w, cache=cache), BatchRuntime(irb, w, cache=cache, openmp=openmp)


def _hf_model(name, sd):
    transformers = pytest.importorskip('transformers')
    cfg = dict(json.loads(data_path('irv2', 'configs', name).read_text()))
    cfg.pop('architectures', None); cfg.pop('torch_dtype', None)
    kind = cfg.pop('model_type')
    conf = {'llama': transformers.LlamaConfig, 'qwen2': transformers.Qwen2Config}[kind](**cfg)
    conf._attn_implementation = 'eager'
    model = {'llama': transformers.LlamaForCausalLM, 'qwen2': transformers.Qwen2ForCausalLM}[kind](conf).float().eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    assert not unexpected and set(missing) <= {'lm_head.weight'}
    return model


def _hf_last(model, seq):
    with torch.no_grad(): return model(torch.tensor([seq])).logits[0].numpy()


@pytest.mark.parametrize('name', CONFIGS)
def test_three_ragged_sequences_match_alone_and_transformers(name, tmp_path, cache):
    ir1, sd, one, three = _pair(name, tmp_path, cache, seed=1)
    model = _hf_model(name, sd)
    prompts = _prompts(ir1['config']['vocab_size'], (9, 4, 14), seed=2)
    got = three.prefill_batch(prompts)
    assert [g.shape for g in got] == [(len(p), ir1['config']['vocab_size']) for p in prompts]
    for g, p in zip(got, prompts):
        assert np.abs(g).max() > 1.0
        assert np.abs(g - one.prefill(p)).max() <= SAME
        assert np.abs(g - _hf_last(model, p)).max() <= HF_TOL
    seqs, last, worst = [list(p) for p in prompts], [g[-1] for g in got], [0.0, 0.0]
    for _ in range(6):
        nxt = [int(np.argmax(x)) for x in last]
        for s, t in zip(seqs, nxt): s.append(t)
        last = three.decode_batch(nxt)
        for s, x in zip(seqs, last):
            one.prefill(s[:-1]); alone = one.decode(s[-1])          # the same sequence, alone, at the same position
            hf = _hf_last(model, s)[-1]
            assert int(np.argmax(hf)) == int(np.argmax(x))
            worst = [max(worst[0], float(np.abs(x - alone).max())), max(worst[1], float(np.abs(x - hf).max()))]
    assert worst[0] <= SAME and worst[1] <= HF_TOL, worst
    assert three.positions == [len(p) + 6 for p in prompts]
    gen = three.generate_batch(prompts, 7)
    assert gen == [one.generate(p, 7) for p in prompts]
    assert [s[len(p):] for s, p in zip(seqs, prompts)] == [g[:6] for g in gen]


def test_slot_reuse_mixed_steps_and_chunked_prefill(tmp_path, cache):
    ir1, sd, one, three = _pair('tiny-qwen2.json', tmp_path, cache, ctx=32, seed=4)
    V = ir1['config']['vocab_size']
    a, b, c, d = _prompts(V, (20, 20, 10, 6), seed=5)
    got = three.prefill_batch([a, b, c])                         # 50 rows > 32: two steps of rows
    for g, p in zip(got, [a, b, c]): assert np.abs(g - one.prefill(p)).max() <= SAME
    three.decode_batch([7, 8, 9])
    # slot 1 takes a new sequence while 0 and 2 keep theirs; then one step mixes a decode (slot 2), a 3-row
    # continuation of slot 1, and a decode of slot 0, in that order
    new = three.prefill_batch([d], slots=[1])[0]
    assert np.abs(new - one.prefill(d)).max() <= SAME
    assert three.positions == [21, 6, 11]
    mixed = three.step([11, 12, 13, 14, 15], [2, 1, 1, 1, 0])
    expect = [one.prefill(c + [9, 11])[-1], one.prefill(d + [12])[-1], one.prefill(d + [12, 13])[-1],
              one.prefill(d + [12, 13, 14])[-1], one.prefill(a + [7, 15])[-1]]
    assert np.abs(mixed - np.stack(expect)).max() <= SAME
    assert three.positions == [22, 9, 12]
    # refused steps change nothing: a full slot, a bad slot or token (Python and C checks)
    three.reset(2)
    three.prefill_batch([list(range(1, 33))], slots=[2])
    before = three.positions
    with pytest.raises(RuntimeFailure, match='slot 2 is full'): three.step([1], [2])
    with pytest.raises(RuntimeFailure, match='not one of the 3 slots'): three.step([1, 1], [0, 3])
    arr = lambda v: np.array(v, np.int32).ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
    toks = np.array([1, 2], np.int32)
    P = toks.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
    assert three.lib.nac_step(three.m, P, arr([0, 7]), 2) == -6          # NAC_E_SLOT
    assert three.lib.nac_step(three.m, P, arr([0, 2]), 2) == -2          # NAC_E_CONTEXT: slot 2 is full
    assert three.positions == before
    three.reset()
    assert three.positions == [0, 0, 0]
    # more prompts than slots: groups of three, slots reused
    ps = _prompts(V, (3, 8, 5, 2, 11), seed=6)
    assert three.generate_batch(ps, 4) == [one.generate(p, 4) for p in ps]


def _aligned(n): return -(-n // 16) * 16
def _a64(n): return -(-n // 64) * 64


@pytest.mark.parametrize('name,ctx', [('tiny-llama.json', None), ('tiny-qwen2.json', 40)])
def test_memory_plan_by_formula(name, ctx):
    raw = json.loads(data_path('irv2', 'configs', name).read_text())
    C = ctx or raw['max_position_embeddings']
    kv, L, hd = raw['num_key_value_heads'], raw['num_hidden_layers'], raw['hidden_size'] // raw['num_attention_heads']
    one = build_ir(data_path('irv2', 'configs', name), ctx=ctx)
    assert build_ir(data_path('irv2', 'configs', name), ctx=ctx, batch=1) == one
    a1 = one['meta']['memory_plan']['activations']
    for B in (2, 3, 7):
        ir = build_ir(data_path('irv2', 'configs', name), ctx=ctx, batch=B)
        p = ir['meta']['memory_plan']
        slot = kv * _aligned(C) * _aligned(hd) * 4                        # one sequence's K (or V) cache, bytes
        caches = {e['buffer']: e['bytes'] for e in p['activations']['layer']}
        assert caches == {'k_cache': B * slot, 'v_cache': B * slot}
        assert p['activations']['layer_stride'] == 2 * _a64(B * slot)
        assert p['activations']['layer_base'] == a1['layer_base'] + 2 * _a64(C * 4)           # row_pos, row_slot
        assert p['activations']['total'] == a1['total'] + 2 * _a64(C * 4) + L * 2 * (_a64(B * slot) - _a64(slot))
        assert p['weights'] == one['meta']['memory_plan']['weights']
        assert ir['meta']['parameters'] == one['meta']['parameters']
        assert ir['config']['batch'] == B and 'batch' not in one['config']


def test_bad_batches_are_typed_errors(cache):
    cfg = data_path('irv2', 'configs', 'tiny-llama.json')
    for bad, msg in [(0, 'positive integer'), (-2, 'positive integer'), (True, 'positive integer'), ('4', 'positive integer'),
                     (2.0, 'positive integer'), (65, 'exceeds the context length 64')]:
        with pytest.raises(ConfigError, match=msg): build_ir(cfg, batch=bad)
    with pytest.raises(ConfigError, match='single-sequence'): build_ir(cfg, batch=2, train=True)
    ir = build_ir(cfg, batch=4)
    for edit, msg in [(lambda c: c.update(batch=5), 'does not hold 5 slots'), (lambda c: c.update(batch=65), 'exceeds context_length'),
                      (lambda c: c.update(batch=4.0), 'batch must be a positive integer'),
                      (lambda c: c.update(batch='4'), r"config.batch: '4' is not of type 'integer'")]:
        bad_ir = json.loads(json.dumps(ir)); edit(bad_ir['config'])
        with pytest.raises(IrError, match=msg): validate_ir(bad_ir)
        with pytest.raises(NacLabError): emit_batch_c(bad_ir)
    with pytest.raises(CodegenError, match='planned for batch 4.*BatchRuntime'): Runtime(ir, None, cache=cache)   # before the weights


def test_openmp_build_matches(tmp_path, cache):
    from nac_lab.irv2.codegen import CFLAGS
    assert {'-Wall', '-Wextra', '-Werror'} <= set(CFLAGS)        # compile_c also fails on any diagnostic output
    ir1, sd, one, three = _pair('tiny-llama.json', tmp_path, cache, batch=4, seed=8)
    omp = BatchRuntime(three.ir, tmp_path/'w.safetensors', cache=cache, openmp=True)
    ps = _prompts(ir1['config']['vocab_size'], (5, 1, 9, 3), seed=9)
    for x, y in zip(three.prefill_batch(ps), omp.prefill_batch(ps)): assert np.abs(x - y).max() <= SAME
    assert np.abs(three.decode_batch([1, 2, 3, 4]) - omp.decode_batch([1, 2, 3, 4])).max() <= SAME


def test_typed_weights_q8_0(tmp_path, cache):
    """q8_0 matrices (irv2.qkernels) in a batch IR: each sequence as with the one-sequence q8_0 runtime."""
    from nac_lab.irv2.qkernels import set_weight_dtypes
    cfg = {'model_type': 'llama', 'hidden_size': 64, 'intermediate_size': 128, 'num_hidden_layers': 2, 'num_attention_heads': 4,
           'num_key_value_heads': 2, 'vocab_size': 96, 'max_position_embeddings': 32, 'rms_norm_eps': 1e-5}
    q1, q3 = set_weight_dtypes(build_ir(cfg), 'q8_0'), set_weight_dtypes(build_ir(cfg, batch=3), 'q8_0')
    w = save_weights(random_weights(build_ir(cfg), seed=11), tmp_path/'w.safetensors')
    one, three = Runtime(q1, w, cache=cache), BatchRuntime(q3, w, cache=cache)
    ps = _prompts(96, (6, 2, 11), seed=12)
    for g, p in zip(three.prefill_batch(ps), ps): assert np.abs(g - one.prefill(p)).max() <= SAME
    assert three.generate_batch(ps, 5) == [one.generate(p, 5) for p in ps]


def _sanitizer_runtimes():
    "The ASan and UBSan runtime libraries of `cc` (None when it has none), to preload into the child Python."
    try:
        libs = [subprocess.run(['cc', f'-print-file-name={n}'], capture_output=True, text=True, check=True).stdout.strip()
                for n in ('libasan.so', 'libubsan.so')]
    except (OSError, subprocess.CalledProcessError):
        return None
    return libs if all(os.path.isabs(p) and os.path.exists(p) for p in libs) else None


CHILD = r'''
import json, sys
import numpy as np
from nac_lab.core import data_path
from nac_lab.irv2.build import build_ir
from nac_lab.irv2.batch import BatchRuntime
from nac_lab.irv2.run import random_weights, save_weights
name, tmp, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ir = build_ir(data_path('irv2', 'configs', name), ctx=32, batch=3)
w = save_weights(random_weights(ir, seed=2), tmp + '/w.safetensors')
san = ('-fsanitize=address,undefined', '-fno-sanitize-recover=all', '-fno-omit-frame-pointer', '-g')
rt = BatchRuntime(ir, w, cache=tmp + '/cache', extra=san)
toks = rt.generate_batch(prompts, 32 - max(map(len, prompts)) + 1)   # the longest prompt reaches the last position
rt.reset(1); rt.prefill_batch([[3, 4]], slots=[1]); rt.step([5, 6], [1, 1])
bad = [rt.lib.nac_reset(rt.m, 3), rt.lib.nac_slot_position(rt.m, -2)]
print(json.dumps({'tokens': toks, 'positions': rt.positions, 'bad': bad}))
'''


def test_batch_c_is_sanitizer_clean(tmp_path):
    libs = _sanitizer_runtimes()
    if libs is None: pytest.skip('the C compiler has no AddressSanitizer/UBSan runtime')
    env = {**os.environ, 'LD_PRELOAD': ' '.join(libs), 'ASAN_OPTIONS': 'detect_leaks=0:abort_on_error=0',
           'UBSAN_OPTIONS': 'print_stacktrace=1'}
    prompts = [list(range(1, 17)), [5, 6, 7], [9] * 8, [2, 3, 4, 5, 6]]
    r = subprocess.run([sys.executable, '-c', CHILD, 'tiny-llama.json', str(tmp_path), json.dumps(prompts)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert 'Sanitizer' not in r.stderr and 'runtime error' not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    ir = build_ir(data_path('irv2', 'configs', 'tiny-llama.json'), ctx=32)
    ref = TorchReference(ir['config'], random_weights(ir, seed=2))
    assert got['tokens'] == [ref.generate(p, 17) for p in prompts]
    assert got['positions'] == [5 + 16, 2 + 2, 8 + 16] and got['bad'] == [-6, -1]


def test_cli_gguf_batch_matches_one_sequence(tmp_path, cache):
    """`nac-lab irv2 build --gguf F --batch 3` then `run` with four prompts (Q8_0 / Q4_K / F32 matrices from the file):
    the same tokens as the one-sequence IR; the logits of each sequence equal to the one-sequence runtime's."""
    from nac_lab.cli import run_cli
    from nac_lab.irv2.gguf import tiny_llama, write_gguf
    cfg, src = tiny_llama(seed=5, vocab=96)
    mats = sorted(n for n in src if src[n].ndim == 2)
    g = write_gguf(tmp_path/'m.gguf', cfg, src, {n: ('Q8_0', 'Q4_K', 'F32')[i % 3] for i, n in enumerate(mats)})
    outs = {}
    for b in (None, 3):
        ir = tmp_path/f'ir{b}.json'
        rc, out, err = run_cli('irv2', 'build', '--gguf', g, '--ctx', 32, *(['--batch', b] if b else []), '-o', ir)
        assert rc == 0, err
        rc, out, err = run_cli('irv2', 'run', ir, g, '--prompt', '1,2,3', '--prompt', '7', '--prompt', '9,8,7,6,5,4', '--prompt', '11,12',
                               '--steps', 6, '--cache', cache)
        assert rc == 0, err
        outs[b] = out.splitlines()
    assert len(outs[3]) == 4 and outs[3] == outs[None]
    from nac_lab.irv2.build import load_ir
    one, three = Runtime(load_ir(tmp_path/'irNone.json'), g, cache=cache), BatchRuntime(tmp_path/'ir3.json', g, cache=cache)
    ps = [[1, 2, 3], [7], [9, 8, 7, 6, 5, 4]]
    for x, p in zip(three.prefill_batch(ps), ps): assert np.abs(x - one.prefill(p)).max() <= SAME
    step = three.decode_batch([4, 5, 6])                   # three rows per matrix read (the Q4_K kernel's multi-row path)
    for x, p, t in zip(step, ps, [4, 5, 6]):
        one.prefill(p); assert np.abs(x - one.decode(t)).max() <= SAME
