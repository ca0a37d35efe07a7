"""GGUF reading (nac_lab.irv2.gguf): decoding against the gguf package's own decoder, the Q/K permutation against
RoPE semantics, architectures and dtypes we refuse, corrupted and truncated files, and the end-to-end path
GGUF -> safetensors -> generated C runtime against the PyTorch reference on the source weights."""
import json
import numpy as np, pytest, torch
import gguf, gguf.quants as gq
from nac_lab.binio import NacLabError, TruncatedError, LimitError
from nac_lab.irv2.gguf import (read_gguf, write_gguf, tiny_llama, open_gguf, gguf_config, gguf_tensor, gguf_to_safetensors,
                               permute_qk, unpermute_qk, GGUFError)
from nac_lab.irv2.quant import quantize, dequantize
from nac_lab.torchref import rope_angles, rope_rotate, rope_rotate_adjacent

KINDS = ['Q8_0', 'Q4_K', 'Q6_K', 'F16', 'BF16', 'F32']

@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp('gguf'); cfg, src = tiny_llama(seed=3)
    mats = sorted(n for n in src if src[n].ndim == 2)
    kinds = {n: KINDS[i % len(KINDS)] for i, n in enumerate(mats)}
    return d, cfg, src, kinds, write_gguf(d / 'mixed.gguf', cfg, src, kinds)

def test_decode_matches_gguf_package(tiny):
    d, cfg, src, kinds, path = tiny
    r = open_gguf(path); c = gguf_config(r)
    for t in r.tensors:
        name, ours = gguf_tensor(r, t, c)
        theirs = gq.dequantize(t.data, t.tensor_type).astype(np.float32)     # their decoder, their shape handling
        if '.attn_q.' in t.name: theirs = unpermute_qk(theirs, cfg['num_attention_heads'])
        if '.attn_k.' in t.name: theirs = unpermute_qk(theirs, cfg['num_key_value_heads'])
        assert theirs.shape == src[name].shape and np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), t.name
        k = kinds.get(name, 'F32')
        assert np.array_equal(ours, dequantize(quantize(src[name], k), k, src[name].shape)), name
        if k in ('F32',): assert np.array_equal(ours, src[name])

def test_file_is_memory_mapped(tiny):
    r = open_gguf(tiny[4]); assert isinstance(r.data, np.memmap)

def _rope(rotate, x, pos):
    "RoPE of `x [heads, head_dim]` at position `pos` with the project's torch reference (`rotate` picks the pairing)."
    c, s = rope_angles([pos], x.shape[-1], 10000.0)
    return rotate(torch.from_numpy(x)[None].double(), c.double(), s.double())[0].numpy()

def test_qk_permutation_turns_half_rope_into_adjacent_rope():
    rng = np.random.default_rng(0); heads, hd, emb = 3, 8, 5
    w = rng.normal(size=(heads * hd, emb)); x = rng.normal(size=emb)
    hf = _rope(rope_rotate, (w @ x).reshape(heads, hd), 7)               # HF: rotate halves
    gg = _rope(rope_rotate_adjacent, (permute_qk(w, heads) @ x).reshape(heads, hd), 7)  # llama.cpp: adjacent pairs
    q_dot_hf = hf @ hf.T; q_dot_gg = gg @ gg.T                           # attention scores agree
    assert np.allclose(q_dot_hf, q_dot_gg)
    assert np.allclose(unpermute_qk(permute_qk(w, heads), heads), w)

def test_tied_embeddings_and_qwen2(tmp_path):
    cfg, src = tiny_llama(seed=1, tie=True, layers=1)
    write_gguf(tmp_path / 't.gguf', cfg, src)
    c, t = read_gguf(tmp_path / 't.gguf')
    assert c['tie_word_embeddings'] is True and 'lm_head.weight' not in t
    cfg.update(model_type='qwen2'); rng = np.random.default_rng(2)
    for p in ('q', 'k', 'v'):
        n_out = src[f'model.layers.0.self_attn.{p}_proj.weight'].shape[0]
        src[f'model.layers.0.self_attn.{p}_proj.bias'] = rng.normal(size=n_out).astype(np.float32)
    write_gguf(tmp_path / 'q.gguf', cfg, src)
    c, t = read_gguf(tmp_path / 'q.gguf')
    assert c['model_type'] == 'qwen2' and c['qkv_bias'] is True
    for n in src: assert np.array_equal(t[n], src[n]), n                  # qwen2: no permutation

def _writer(path, arch='llama'):
    w = gguf.GGUFWriter(path, arch)
    for f, v in (('add_block_count', 1), ('add_context_length', 16), ('add_embedding_length', 32), ('add_feed_forward_length', 64),
                 ('add_head_count', 2)): getattr(w, f)(v)
    return w

def _finish(w):
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()

def test_unsupported_architecture_and_dtype(tmp_path):
    for arch in ('falcon', 'gemma2', 'mistral'):          # refused by name (Mistral files say `llama`), the supported ones listed
        w = _writer(tmp_path / 'a.gguf', arch); w.add_tensor('token_embd.weight', np.zeros((8, 32), np.float32)); _finish(w)
        with pytest.raises(GGUFError, match=f"unsupported architecture '{arch}' \\(supported: llama, qwen2, gemma, gpt2, phi2, "
                                            f"gptneox, gptj\\)"): read_gguf(tmp_path / 'a.gguf')
    w = _writer(tmp_path / 'b.gguf'); w.add_tensor('token_embd.weight', np.zeros((8, 74), np.uint8),
                                                   raw_dtype=gguf.GGMLQuantizationType.IQ2_XS); _finish(w)
    with pytest.raises(GGUFError, match="type IQ2_XS, not one of"): read_gguf(tmp_path / 'b.gguf')
    w = _writer(tmp_path / 'c.gguf'); w.add_tensor('token_embd.weight', np.zeros((8, 32), np.float32))
    w.add_tensor('rope_freqs.weight', np.ones(8, np.float32)); _finish(w)
    with pytest.raises(GGUFError, match='RoPE scaling'): read_gguf(tmp_path / 'c.gguf')
    w = _writer(tmp_path / 'd.gguf'); w.add_tensor('token_embd.weight', np.zeros((8, 32), np.float32))
    w.add_tensor('blk.0.attn_qkv.weight', np.zeros((8, 32), np.float32)); _finish(w)
    with pytest.raises(GGUFError, match="'blk.0.attn_qkv.weight' has no HF equivalent"): read_gguf(tmp_path / 'd.gguf')

def test_truncated_and_corrupted_files_give_typed_errors(tiny, tmp_path):
    data = tiny[4].read_bytes(); rng = np.random.default_rng(11); p = tmp_path / 'x.gguf'
    cuts = sorted(set(rng.integers(0, len(data), 60).tolist()) | {0, 3, 23, 24, 100})
    for n in cuts:
        p.write_bytes(data[:n])
        with pytest.raises((TruncatedError, LimitError)): read_gguf(p)      # found by the scan, with an offset
    head = 4096                                                           # header, metadata and tensor table live here
    for i in range(150):
        b = bytearray(data); k = int(rng.integers(1, 4))
        for _ in range(k): b[int(rng.integers(0, head))] = int(rng.integers(0, 256))
        p.write_bytes(bytes(b))
        try: read_gguf(p)
        except NacLabError: pass                                          # any other exception fails the test

def test_gguf_to_safetensors_runs_in_the_irv2_runtime(tiny, tmp_path):
    from nac_lab.irv2.build import build_ir
    from nac_lab.irv2.run import Runtime, TorchReference
    d, cfg, src, kinds, path = tiny
    ir = None
    for k, gg in (('F32', write_gguf(tmp_path / 'f32.gguf', cfg, src)), ('mixed', path)):
        c = gguf_to_safetensors(gg, tmp_path / f'{k}.safetensors', tmp_path / f'{k}.json')
        ir = ir or build_ir(json.loads((tmp_path / f'{k}.json').read_text()), ctx=32)
        rt = Runtime(ir, tmp_path / f'{k}.safetensors', cache=tmp_path / 'cache')
        ref_w = src if k == 'F32' else {n: dequantize(quantize(a, kinds.get(n, 'F32')), kinds.get(n, 'F32'), a.shape) for n,
                                        a in src.items()}
        prompt = [int(t) for t in np.random.default_rng(5).integers(0, cfg['vocab_size'], 8)]
        got = rt.prefill(prompt); want = TorchReference(ir['config'], ref_w).forward(prompt).numpy()
        assert np.abs(got - want).max() < 1e-4, k
        rt.close()

def test_config_defaults_when_optional_keys_are_absent(tmp_path):
    w = _writer(tmp_path / 'm.gguf'); w.add_tensor('token_embd.weight', np.zeros((8, 32), np.float32)); _finish(w)
    c = gguf_config(open_gguf(tmp_path / 'm.gguf'))
    # vocab: the embedding's rows; kv heads: = heads; rope_theta: llama.cpp's default
    assert c['vocab_size'] == 8 and c['num_key_value_heads'] == 2 and c['rope_theta'] == 10000.0
    assert c['tie_word_embeddings'] is True and c['hidden_size'] == 32 and 'head_dim' not in c


def test_bias_tensors_set_the_bias_flags_and_are_never_dropped(tmp_path):
    """A Llama GGUF whose projections all carry biases: the config read from it asks for every one of them (the
    tensors say which biases exist; llama.cpp's llama architecture allows q/k/v/o and MLP biases), and the C runtime
    run on the GGUF equals the runtime run on the same weights from safetensors. An IR whose config leaves the biases
    out is refused with the tensors it would drop, instead of running without them."""
    from nac_lab.irv2.build import build_ir
    from nac_lab.irv2.gguf_run import gguf_ir
    from nac_lab.irv2.maps import WeightError
    from nac_lab.irv2.run import Runtime, save_weights
    cfg, src = tiny_llama(seed=4, layers=1)
    rng = np.random.default_rng(5)
    for n in [k for k in src if k.endswith('_proj.weight')]:
        src[n[:-len('weight')] + 'bias'] = rng.normal(0, 0.1, src[n].shape[0]).astype(np.float32)
    path = write_gguf(tmp_path / 'b.gguf', cfg, src)
    c = gguf_config(open_gguf(path))
    assert (c['qkv_bias'], c['attention_bias'], c['mlp_bias']) == (True, True, True)
    ir = gguf_ir(path)
    assert {'bq', 'bk', 'bv', 'bo', 'b_gate', 'b_up', 'b_down'} <= {b['name'] for b in ir['buffers']}
    prompt = [1, 5, 9, 2, 33]
    got = Runtime(ir, path, cache=tmp_path).prefill(prompt)
    st = save_weights(src, tmp_path / 'b.safetensors')
    want = Runtime(build_ir({**cfg, 'attention_bias': True, 'mlp_bias': True}), st, cache=tmp_path).prefill(prompt)
    plain = {k: v for k, v in src.items() if not k.endswith('.bias')}
    unbiased = Runtime(build_ir(cfg), save_weights(plain, tmp_path / 'p.safetensors'), cache=tmp_path).prefill(prompt)
    assert np.abs(got - want).max() < 1e-5 < np.abs(got - unbiased).max()
    with pytest.raises(WeightError, match=r'7 tensor\(s\) of the file are not used by the IR'):
        Runtime(build_ir(cfg), path, cache=tmp_path)
    cfg2, src2 = tiny_llama(seed=6, layers=1)
    src2['model.layers.0.self_attn.o_proj.bias'] = np.zeros(cfg2['hidden_size'], np.float32)
    with pytest.raises(GGUFError, match='qwen2 has no attn_output bias'):
        gguf_config(open_gguf(write_gguf(tmp_path / 'q.gguf', {**cfg2, 'model_type': 'qwen2'}, src2)))


NEW_KINDS = ['Q4_0', 'Q4_1', 'Q5_0', 'Q5_1', 'Q2_K', 'Q3_K', 'Q5_K']

def test_more_ggml_kinds_decode_like_gguf_and_run(tmp_path):
    """A tiny Llama whose matrices use the seven kinds added for #28 (and every one at least twice): each tensor decodes
    bit for bit like the gguf package's decoder, and the C runtime run straight on the GGUF equals the runtime on the
    same (dequantized) weights from safetensors."""
    from nac_lab.irv2.gguf_run import gguf_ir
    from nac_lab.irv2.build import build_ir
    from nac_lab.irv2.run import Runtime, save_weights
    cfg, src = tiny_llama(seed=7, layers=2)
    mats = sorted(n for n in src if src[n].ndim == 2)
    kinds = {n: NEW_KINDS[i % len(NEW_KINDS)] for i, n in enumerate(mats)}
    path = write_gguf(tmp_path / 'k.gguf', cfg, src, kinds)
    r = open_gguf(path); c = gguf_config(r)
    assert sorted({t.tensor_type.name for t in r.tensors} - {'F32'}) == sorted(NEW_KINDS)
    deq = {}
    for t in r.tensors:
        name, ours = gguf_tensor(r, t, c)
        theirs = gq.dequantize(t.data, t.tensor_type).astype(np.float32)
        if '.attn_q.' in t.name: theirs = unpermute_qk(theirs, cfg['num_attention_heads'])
        if '.attn_k.' in t.name: theirs = unpermute_qk(theirs, cfg['num_key_value_heads'])
        assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), t.name
        assert np.abs(ours - src[name]).max() < 0.1, t.name                   # a real quantization of the source weights
        deq[name] = ours
    prompt = [3, 17, 9, 40, 2]
    ir = gguf_ir(path, ctx=16)
    dts = {b['dtype'] for b in ir['buffers'] if b['role'] == 'weight'}
    assert {'q4_0', 'q4_1', 'q5_0', 'q5_1', 'q2_k', 'q3_k', 'q5_k'} <= dts          # every kind runs on its own C kernel
    got = Runtime(ir, path, cache=tmp_path).prefill(prompt)
    want = Runtime(build_ir(cfg, ctx=16), save_weights(deq, tmp_path / 'k.safetensors'), cache=tmp_path).prefill(prompt)
    assert np.abs(got - want).max() < 1e-4

# (key, writer method, value): every metadata key gguf_config reads, written with a wrong type
WRONG_TYPES = [('general.architecture', 'add_array', ['llama', 'qwen2']), ('general.architecture', 'add_uint32', 7),
               ('llama.block_count', 'add_string', 'two'), ('llama.block_count', 'add_float32', 2.0),
               ('llama.context_length', 'add_array', [16]), ('llama.embedding_length', 'add_bool', True),
               ('llama.feed_forward_length', 'add_int32', -64), ('llama.attention.head_count', 'add_string', '2'),
               ('llama.attention.head_count_kv', 'add_array', [2, 2]), ('llama.vocab_size', 'add_float64', 8.5),
               ('llama.attention.key_length', 'add_string', '16'),
               ('llama.attention.layer_norm_rms_epsilon', 'add_string', '1e-5'), ('llama.rope.freq_base', 'add_array', [1e4]),
               ('llama.rope.freq_base', 'add_bool', False), ('llama.rope.scaling.type', 'add_uint8', 1)]

@pytest.mark.parametrize('key,method,value', WRONG_TYPES, ids=[f'{k}-{m}' for k, m, _ in WRONG_TYPES])
def test_metadata_of_the_wrong_type_is_a_typed_error_naming_key_and_offset(tmp_path, key, method, value):
    w = _writer(tmp_path / 'w.gguf'); getattr(w, method)(key, value)
    w.add_tensor('token_embd.weight', np.zeros((8, 32), np.float32)); _finish(w)
    r = open_gguf(tmp_path / 'w.gguf')
    with pytest.raises(GGUFError) as ex: gguf_config(r)
    msg = str(ex.value)
    assert f"metadata '{key}' must be" in msg and f'at offset {r.fields[key].offset:#x}' in msg, msg

def test_metadata_type_fuzz(tmp_path):
    """Random keys of gguf_config's set given random value types (scalars, strings, arrays, nested arrays): only
    NacLabErrors come out, never a Python exception."""
    rng = np.random.default_rng(13)
    makers = [('add_uint8', lambda: int(rng.integers(0, 255))), ('add_int64', lambda: int(rng.integers(-9, 9))),
              ('add_float32', lambda: float(rng.normal())), ('add_bool', lambda: bool(rng.integers(0, 2))),
              ('add_string', lambda: 'x\x1b[31m'), ('add_array', lambda: [int(v) for v in rng.integers(0, 9, int(rng.integers(0, 3)))]),
              ('add_array', lambda: [['a'], ['b']]), ('add_float64', lambda: float('nan'))]
    keys = sorted({k for k, _, _ in WRONG_TYPES})
    for i in range(40):
        w = _writer(tmp_path / f'f{i}.gguf')
        for k in rng.choice(keys, int(rng.integers(1, 4)), replace=False):
            m, v = makers[int(rng.integers(0, len(makers)))]; getattr(w, m)(str(k), v())
        w.add_tensor('token_embd.weight', np.zeros((8, 32), np.float32)); _finish(w)
        try: read_gguf(tmp_path / f'f{i}.gguf')
        except NacLabError as ex: assert '\x1b' not in str(ex)                 # file strings are escaped
