"""Weight dtypes in the generated C (nac_lab.irv2.qkernels) and IR v2 straight from GGUF (nac_lab.irv2.gguf_run):
the C decoders against the `gguf` package's own decoder, bit for bit; typed models against HuggingFace
`transformers` on the same weights decoded to fp32 (greedy tokens identical, logits within a tolerance per dtype);
GGUF files built with `gguf.GGUFWriter` (Llama with permuted Q/K and a tied embedding, Qwen2 with biases) run from
the mapped file; the CLI; the kernels under AddressSanitizer + UBSan."""
import os, subprocess, sys
import numpy as np, pytest, torch
import gguf.quants as gq
from gguf import GGMLQuantizationType
from nac_lab.cli import run_cli
from nac_lab.irv2.build import build_ir, load_ir
from nac_lab.irv2.run import Runtime, random_weights, save_weights
from nac_lab.irv2.quant import quantize
from nac_lab.irv2.qkernels import (WEIGHT_DTYPES, kernel_harness, c_dequant, c_linear, reference_linear, set_weight_dtypes,
                                   dequantized_weights, row_block)
from nac_lab.irv2.gguf import write_gguf, tiny_llama, read_gguf, gguf_to_safetensors
from nac_lab.irv2.gguf_run import gguf_ir, GGUFWeights
from nac_lab.irv2.maps import IrError

# max |logit| difference allowed against transformers on the decoded weights, per dtype: fp32 arithmetic in both,
# only the summation order differs (logits are O(1)); the same bound for every dtype, since the weights are identical.
TOL = {'fp32': 1e-4, 'bf16': 1e-4, 'fp16': 1e-4, 'q8_0': 1e-4, 'q4_k': 1e-4, 'q6_k': 1e-4, 'q4_0': 1e-4, 'q4_1': 1e-4, 'q5_0': 1e-4,
       'q5_1': 1e-4, 'q2_k': 1e-4, 'q3_k': 1e-4, 'q5_k': 1e-4}
CFG = dict(model_type='llama', hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, vocab_size=128, max_position_embeddings=32, rms_norm_eps=1e-5, rope_theta=10000.0,
           tie_word_embeddings=False)


@pytest.fixture(scope='module')
def cache(tmp_path_factory): return tmp_path_factory.mktemp('qk_cache')


@pytest.fixture(scope='module')
def libs(tmp_path_factory):
    "The kernels compiled portably, and with AVX2 intrinsics where the CPU has them (the same bits expected)."
    d = tmp_path_factory.mktemp('qk'); avx2 = os.path.exists('/proc/cpuinfo') and 'avx2' in open('/proc/cpuinfo').read()
    return [kernel_harness(d / 'libqk.so')] + ([kernel_harness(d / 'libqk_avx2.so', extra=('-mavx2',))] if avx2 else [])


@pytest.mark.parametrize('dtype', list(WEIGHT_DTYPES))
def test_c_decoder_matches_gguf_package(dtype, libs):
    rng = np.random.default_rng(list(WEIGHT_DTYPES).index(dtype))
    cols = row_block(dtype) * (3 if row_block(dtype) > 1 else 264)
    w = (rng.standard_normal((9, cols)) * rng.uniform(0.01, 10, (9, 1))).astype(np.float32)
    w[0, :40] = 0                                                        # a zero block / sub-block
    raw = quantize(w, WEIGHT_DTYPES[dtype])
    theirs = gq.dequantize(raw.reshape(9, -1), GGMLQuantizationType[WEIGHT_DTYPES[dtype]]).astype(np.float32)
    x = rng.standard_normal((13, cols)).astype(np.float32); b = rng.standard_normal(9).astype(np.float32)
    for lib in libs:
        assert np.array_equal(c_dequant(lib, raw, dtype, 9, cols).view(np.uint32), theirs.view(np.uint32))
        y = c_linear(lib, x, raw, dtype, 9, b)
        assert np.array_equal(y.view(np.uint32), reference_linear(x, theirs, b, 8 if dtype == 'fp32' else 32).view(np.uint32))
    exact = x.astype(np.float64) @ theirs.T.astype(np.float64) + b
    bound = 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(theirs.T.astype(np.float64))) + 1e-6    # fp32 rounding of the sum
    assert (np.abs(y - exact) <= bound).all()



@pytest.mark.parametrize('dtype', [d for d in WEIGHT_DTYPES if row_block(d) > 1])
def test_c_decoder_on_random_blocks_with_edge_scales(dtype, libs):
    """Random bytes as blocks, their f16 scales drawn from 0, -0, subnormals, the largest half, inf and NaN half the
    time: the C decoder gives the bits of `quant.dequantize` (NaN where it has NaN)."""
    from nac_lab.irv2.quant import dequantize, BLOCKS
    kind = WEIGHT_DTYPES[dtype]; be, bb = BLOCKS[kind]; rng = np.random.default_rng(29)
    scales = {'Q8_0': [0], 'Q4_0': [0], 'Q5_0': [0], 'Q4_1': [0, 2], 'Q5_1': [0, 2], 'Q4_K': [0, 2], 'Q6_K': [208], 'Q5_K': [0, 2],
              'Q2_K': [80, 82], 'Q3_K': [108]}[kind]
    edge = np.array([0, 0x8000, 0x0001, 0x03FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0x3C00], np.uint16)
    rows, per_row = 6, 3; raw = rng.integers(0, 256, (rows * per_row, bb), dtype=np.uint8)
    for off in scales:
        h = np.where(rng.random(len(raw)) < 0.5, edge[rng.integers(0, len(edge), len(raw))],
                     rng.normal(0, 1, len(raw)).astype(np.float16).view(np.uint16)).astype(np.uint16)
        raw[:, off:off + 2] = h[:, None].view(np.uint8)
    want = dequantize(raw.reshape(-1), kind, (rows, per_row * be))
    for lib in libs:
        got = c_dequant(lib, raw.reshape(-1), dtype, rows, per_row * be)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(got.view(np.uint32)[~np.isnan(got)], want.view(np.uint32)[~np.isnan(want)])

def _hf(cfg, sd):
    import transformers
    c = {k: v for k, v in cfg.items() if k != 'model_type'}
    conf = {'llama': transformers.LlamaConfig, 'qwen2': transformers.Qwen2Config}[cfg['model_type']](**c)
    conf._attn_implementation = 'eager'
    m = {'llama': transformers.LlamaForCausalLM, 'qwen2': transformers.Qwen2ForCausalLM}[cfg['model_type']](conf).float().eval()
    missing, unexpected = m.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, strict=False)
    assert not unexpected and set(missing) <= {'lm_head.weight'}
    return m


def _hf_greedy(m, prompt, steps):
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(steps): seq.append(int(m(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize('dtype', ['bf16', 'fp16', 'q8_0', 'q4_k', 'q6_k'])
def test_typed_model_against_transformers(dtype, tmp_path, cache):
    ir32 = build_ir(CFG); sd = random_weights(ir32, seed=4)
    sd = {k: v * (4 if 'embed' in k else 1) for k, v in sd.items()}          # livelier logits, varied greedy tokens
    ir = set_weight_dtypes(ir32, dtype)
    rt = Runtime(ir, save_weights(sd, tmp_path / 'w.safetensors'), cache=cache)
    m = _hf(CFG, dequantized_weights(ir, sd))
    prompt = [3, 77, 12, 101, 5, 64]
    with torch.no_grad(): hf = m(torch.tensor([prompt])).logits[0].numpy()
    got = rt.prefill(prompt)
    assert np.abs(hf).max() > 1 and np.abs(got - hf).max() < TOL[dtype]
    toks = rt.generate(prompt, 8)
    assert toks == _hf_greedy(m, prompt, 8) and len(set(toks)) > 1


def test_prefill_in_groups_of_eight_and_openmp(tmp_path, cache):
    """A 19-token prefill (groups of 8, 8, 3 tokens per decoded weight row) equals token-by-token decoding, bit for bit;
    the OpenMP build gives the same logits."""
    ir = set_weight_dtypes(build_ir(CFG), 'q4_k')
    w = save_weights(random_weights(ir, seed=5), tmp_path / 'w.safetensors')
    rt, omp = Runtime(ir, w, cache=cache), Runtime(ir, w, cache=cache, openmp=True)
    toks = [int(t) for t in np.random.default_rng(0).integers(0, 128, 19)]
    pre = rt.prefill(toks)
    rt.prefill(toks[:1]); one = [rt.decode(t) for t in toks[1:]]
    assert np.array_equal(pre[1:], np.stack(one))
    assert np.array_equal(omp.prefill(toks), pre)


def test_tied_embedding_and_qwen2_biases_from_gguf(tmp_path, cache):
    """Llama with a tied Q6_K embedding (the lm_head reads the same blocks) and Qwen2 with q/k/v biases (no Q/K
    permutation), both built and run straight from GGUF, against transformers on the decoded weights."""
    cfg, sd = tiny_llama(seed=6, hidden=256, inter=512, vocab=96, tie=True)
    kinds = {n: 'Q6_K' if 'embed' in n else 'Q4_K' if '.self_attn.' in n else 'Q8_0' for n in sd if sd[n].ndim == 2}
    q = {'model_type': 'qwen2', 'hidden_size': 256, 'num_hidden_layers': 2, 'num_attention_heads': 4, 'num_key_value_heads': 2,
         'intermediate_size': 512, 'vocab_size': 96, 'max_position_embeddings': 128, 'rms_norm_eps': 1e-6, 'rope_theta': 1e6,
         'tie_word_embeddings': False}
    qsd = dict(sd); qsd['lm_head.weight'] = sd['model.embed_tokens.weight'][::-1].copy()
    for l in range(2):
        for p, n in (('q', 256), ('k', 128), ('v', 128)):
            qsd[f'model.layers.{l}.self_attn.{p}_proj.bias'] = np.random.default_rng(l).normal(0, 0.2, n).astype(np.float32)
    for name, (c, s, k) in {'llama': (cfg, sd, kinds), 'qwen2': (q, qsd, {**kinds, 'lm_head.weight': 'Q6_K'})}.items():
        path = write_gguf(tmp_path / f'{name}.gguf', c, s, k)
        ir = gguf_ir(path, ctx=32)
        assert ir['meta']['weight_dtypes']['wq'] == 'q4_k' and ir['meta']['weight_dtypes']['token_emb'] == 'q6_k'
        if name == 'llama': assert ir['meta']['weight_dtypes']['lm_head'] == 'q6_k' and ir['config']['tie_word_embeddings']
        else: assert ir['meta']['weight_dtypes']['bq'] == 'fp32'
        rt = Runtime(ir, path, cache=cache)
        gcfg, dec = read_gguf(path)
        m = _hf({k: v for k, v in gcfg.items() if k not in ('architectures', 'hidden_act')}, dec)
        prompt = [9, 41, 2, 77, 30]
        with torch.no_grad(): hf = m(torch.tensor([prompt])).logits[0].numpy()
        assert np.abs(rt.prefill(prompt) - hf).max() < 1e-4, name
        assert rt.generate(prompt, 6) == _hf_greedy(m, prompt, 6), name


def test_gguf_weights_are_mapped_not_copied(tmp_path):
    cfg, sd = tiny_llama(seed=1, hidden=256, inter=512)
    path = write_gguf(tmp_path / 'm.gguf', cfg, sd, {n: 'Q4_K' for n in sd if sd[n].ndim == 2})
    w = GGUFWeights(path)
    up = w.raw('model.layers.0.mlp.up_proj.weight', 'q4_k')
    assert isinstance(up, np.memmap) and up.size == 512 * 256 // 256 * 144
    q = w.raw('model.layers.0.self_attn.q_proj.weight', 'q4_k')          # rows moved back to HF order, blocks unchanged
    assert np.array_equal(q, quantize(sd['model.layers.0.self_attn.q_proj.weight'], 'Q4_K'))


def test_cli_build_and_run_from_gguf(tmp_path, monkeypatch, cache):
    monkeypatch.chdir(tmp_path)
    cfg, sd = tiny_llama(seed=2, hidden=256, inter=512)
    write_gguf(tmp_path / 'm.gguf', cfg, sd, {n: 'Q4_K' for n in sd if sd[n].ndim == 2})
    rc, out, err = run_cli('irv2', 'build', '--gguf', 'm.gguf', '--ctx', 32, '-o', 'g.json')
    assert rc == 0, err
    assert load_ir('g.json')['config']['dtype'] == 'q4_k'
    rc, out, err = run_cli('irv2', 'run', 'g.json', 'm.gguf', '--tokens', '5,6,7', '--steps', 4, '--cache', str(cache))
    assert rc == 0, err
    gguf_to_safetensors('m.gguf', 'm.safetensors', 'config.json')
    ref = Runtime(build_ir('config.json', ctx=32), 'm.safetensors', cache=cache)
    assert out.strip() == ','.join(map(str, ref.generate([5, 6, 7], 4)))
    # CONFIG + --weights FILE.gguf, and --weights-dtype for a safetensors model
    rc, out, err = run_cli('irv2', 'build', 'config.json', '--weights', 'm.gguf', '--ctx', 32, '-o', 'g2.json')
    assert rc == 0 and load_ir('g2.json')['buffers'] == load_ir('g.json')['buffers']
    rc, out, err = run_cli('irv2', 'build', 'config.json', '--ctx', 32, '--weights-dtype', 'q8_0', '-o', 'q8.json')
    assert rc == 0 and load_ir('q8.json')['config']['dtype'] == 'q8_0'
    rc, out, err = run_cli('irv2', 'run', 'q8.json', 'm.safetensors', '--tokens', '5,6,7', '--steps', 2, '--cache', str(cache))
    assert rc == 0, err
    rc, out, err = run_cli('irv2', 'build', 'config.json', '--gguf', 'm.gguf', '-o', 'x.json')
    assert rc == 1 and 'give either CONFIG' in err
    rc, out, err = run_cli('irv2', 'build', 'config.json', '--weights', 'm.safetensors', '-o', 'x.json')
    assert rc == 1 and 'expected a .gguf file' in err
    rc, out, err = run_cli('irv2', 'build', '-o', 'x.json')
    assert rc == 1 and 'or --gguf FILE' in err
    (tmp_path / 'cut.gguf').write_bytes((tmp_path / 'm.gguf').read_bytes()[:5000])
    rc, out, err = run_cli('irv2', 'run', 'g.json', 'cut.gguf', '--tokens', '5', '--cache', str(cache))
    assert rc == 1 and 'GGUF' in err and 'Traceback' not in err


def test_bad_rows_and_dtypes():
    with pytest.raises(IrError, match='not a whole number of 256-element q6_k blocks'):
        set_weight_dtypes(build_ir({**CFG, 'intermediate_size': 320}), 'q6_k')       # w_down rows: 320 values
    with pytest.raises(IrError, match="unknown weight dtype 'int4'"):
        set_weight_dtypes(build_ir(CFG), 'fp32', {'wq': 'int4'})


CHILD = r'''
import sys, numpy as np
from nac_lab.irv2.build import build_ir
from nac_lab.irv2.run import Runtime, random_weights, save_weights
from nac_lab.irv2.qkernels import set_weight_dtypes
cfg, tmp = eval(sys.argv[1]), sys.argv[2]
for i, dtype in enumerate(['bf16', 'fp16', 'q8_0', 'q4_k', 'q6_k']):
    ir = set_weight_dtypes(build_ir(cfg), dtype)
    rt = Runtime(ir, save_weights(random_weights(ir, seed=i), f'{tmp}/w{i}.safetensors'), cache=tmp + '/cache',
                 extra=('-fsanitize=address,undefined', '-fno-sanitize-recover=all', '-fno-omit-frame-pointer', '-g'))
    toks = rt.generate(list(range(1, 12)), 21)          # 11 + 21 - 1 = 31 positions, prefill groups 8 + 3
    print(dtype, toks)
'''


def test_typed_kernels_are_sanitizer_clean(tmp_path):
    try:
        libs = [subprocess.run(['cc', f'-print-file-name={n}'], capture_output=True, text=True, check=True).stdout.strip()
                for n in ('libasan.so', 'libubsan.so')]
    except (OSError, subprocess.CalledProcessError): libs = []
    if not libs or not all(os.path.isabs(p) and os.path.exists(p) for p in libs): pytest.skip('no ASan/UBSan runtime')
    env = {**os.environ, 'LD_PRELOAD': ' '.join(libs), 'ASAN_OPTIONS': 'detect_leaks=0:abort_on_error=0'}
    r = subprocess.run([sys.executable, '-c', CHILD, repr(CFG), str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert 'Sanitizer' not in r.stderr and 'runtime error' not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0 and r.stdout.count('\n') == 5, r.stderr[-3000:]
