"""GGUF files of every family IR v2 builds (issue #28 item 5): Mistral (written as `llama`), Gemma, GPT-2, Phi-2
(separate and fused qkv), GPT-NeoX (parallel and sequential), GPT-J.

The files are not made by our writer: each test builds a tiny random transformers model and converts it the way
llama.cpp's `convert_hf_to_gguf.py` does, written out here by hand with the `gguf` package's `GGUFWriter` and the
package's own HF -> GGUF tensor name table (`gguf.get_tensor_name_map`): Llama Q/K rows permuted for adjacent-pair
RoPE, Gemma norms stored as w + 1 and no output tensor, GPT-2 Conv1D matrices transposed to [out, in] and the
embedding copied to `output`, GPT-NeoX's fused qkv regrouped from per-head to [q; k; v]. Then `nac_lab` reads the
file (`gguf_to_safetensors`, and `gguf_ir` straight on the mapped file) and the generated C runtime must give the
transformers model's logits (prefill and greedy decode, 1e-4). Our own `write_gguf` is checked against the same
hand-made files (round trip)."""
import numpy as np
import pytest
import torch
import gguf
import gguf.quants as gq
from nac_lab.irv2.build import build_ir, read_config
from nac_lab.irv2.gguf import read_gguf, write_gguf, gguf_to_safetensors, open_gguf, gguf_config, GGUFError
from nac_lab.irv2.gguf_run import gguf_ir
from nac_lab.irv2.run import Runtime
from hf_parity import prefill_and_decode

transformers = pytest.importorskip('transformers')
TOL = 1e-4
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=101,
             max_position_embeddings=16)
L, H, E, HD = 2, 4, 64, 16          # layers, heads, hidden, head_dim of SMALL

# case -> (transformers config, model class, GGUF arch, extra metadata the converter writes)
CASES = {
    'mistral': lambda: (transformers.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=None), transformers.MistralForCausalLM),
    'gemma': lambda: (transformers.GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=24), transformers.GemmaForCausalLM),
    'gpt2': lambda: (transformers.GPT2Config(n_embd=E, n_layer=L, n_head=H, n_positions=16, vocab_size=101), transformers.GPT2LMHeadModel),
    'phi': lambda: (transformers.PhiConfig(**SMALL), transformers.PhiForCausalLM),
    'phi_fused': lambda: (transformers.PhiConfig(**SMALL), transformers.PhiForCausalLM),
    'gpt_neox': lambda: (transformers.GPTNeoXConfig(**SMALL), transformers.GPTNeoXForCausalLM),
    'gpt_neox_sequential': lambda: (transformers.GPTNeoXConfig(**SMALL, use_parallel_residual=False, rotary_pct=0.5),
                                    transformers.GPTNeoXForCausalLM),
    'gptj': lambda: (transformers.GPTJConfig(n_embd=E, n_layer=L, n_head=H, n_positions=16, vocab_size=101, rotary_dim=8),
                     transformers.GPTJForCausalLM),
}
ARCH = {'mistral': 'llama', 'gemma': 'gemma', 'gpt2': 'gpt2', 'phi': 'phi2', 'phi_fused': 'phi2', 'gpt_neox': 'gptneox',
        'gpt_neox_sequential': 'gptneox', 'gptj': 'gptj'}
ROTARY = {'phi': 8, 'phi_fused': 8, 'gpt_neox': 4, 'gpt_neox_sequential': 8, 'gptj': 8}      # rotated dims per head, by hand


@pytest.fixture(scope='module')
def cache(tmp_path_factory): return tmp_path_factory.mktemp('gguf_families')


def _model(case, seed=0):
    "A transformers model of `case` whose every parameter (norms and biases too) is random."
    conf, cls = CASES[case]()
    conf._attn_implementation = 'eager'
    torch.manual_seed(seed)
    model = cls(conf).float().eval()
    with torch.no_grad():
        for p in model.parameters(): p.add_(torch.randn_like(p) * 0.05)
    return conf, model


def _llama_rows(n_rows, n_head):
    "Row order llama.cpp's converter gives Llama q/k: within each head, HF rows i and i + d/2 become adjacent (2i, 2i+1)."
    d = n_rows // n_head; order = []
    for h in range(n_head):
        for i in range(d // 2): order += [h * d + i, h * d + d // 2 + i]
    return np.array(order)


def _neox_rows(n_head, hd):
    "Row order of llama.cpp's GPT-NeoX qkv: HF keeps [head][q, k, v]; the converter writes all q rows, then k, then v."
    return np.array([h * 3 * hd + part * hd + i for part in range(3) for h in range(n_head) for i in range(hd)])


def _convert(case, conf, model, path, quant=None):
    """Write `model` as llama.cpp's converter would (by hand; see the module docstring). `quant`: GGML type for the 2-D
    matrices (quantized with the gguf package's own quantizer), else F32."""
    arch = ARCH[case]; c = conf.to_dict()
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(L); w.add_context_length(16); w.add_embedding_length(E); w.add_head_count(H)
    if arch in ('llama', 'gemma'):
        w.add_feed_forward_length(96); w.add_head_count_kv(c['num_key_value_heads']); w.add_layer_norm_rms_eps(c['rms_norm_eps'])
        w.add_rope_freq_base(10000.0)
        if arch == 'gemma': w.add_key_length(24); w.add_value_length(24)
    else:
        w.add_feed_forward_length(4 * E if arch in ('gpt2', 'gptj') else 96)
        w.add_layer_norm_eps(c.get('layer_norm_epsilon', c.get('layer_norm_eps')))
        if case in ROTARY: w.add_rope_dimension_count(ROTARY[case])
        if arch == 'gptneox': w.add_parallel_residual(case == 'gpt_neox')
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[{'gptneox': 'GPTNEOX', 'phi2': 'PHI2'}.get(arch, arch.upper())], L)
    out = {}
    for k, a in sd.items():
        if k.endswith(('.attn.bias', '.attn.masked_bias')) or (arch in ('gemma', 'gpt2') and k == 'lm_head.weight'):
            continue                                    # causal-mask buffers; tied heads (Gemma has none, GPT-2 copies wte)
        g = names.get_name(k, try_suffixes=('.weight', '.bias'))
        assert g is not None, k
        if arch == 'llama' and ('.q_proj.' in k or '.k_proj.' in k):
            a = a[_llama_rows(a.shape[0], H if '.q_proj.' in k else c['num_key_value_heads'])]
        if arch == 'gemma' and k.endswith('norm.weight'): a = a + 1
        if arch == 'gpt2' and k.endswith(('.c_attn.weight', '.c_proj.weight', '.c_fc.weight')): a = a.T
        if arch == 'gptneox' and '.query_key_value.' in k: a = a[_neox_rows(H, HD)]
        out[g] = np.ascontiguousarray(a, np.float32)
        if arch == 'gpt2' and g == 'token_embd.weight': out['output.weight'] = out[g].copy()
    if case == 'phi_fused':                               # an older Phi-2 file: one Wqkv per layer, rows [q; k; v]
        for l in range(L):
            for s in ('weight', 'bias'):
                out[f'blk.{l}.attn_qkv.{s}'] = np.concatenate([out.pop(f'blk.{l}.attn_{p}.{s}') for p in 'qkv'])
    for g, a in out.items():
        if quant and a.ndim == 2 and a.shape[1] % 32 == 0:
            w.add_tensor(g, gq.quantize(a, gguf.GGMLQuantizationType[quant]), raw_dtype=gguf.GGMLQuantizationType[quant])
        else: w.add_tensor(g, a)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return path


def _prompt(seed): return [int(t) for t in np.random.default_rng(seed).integers(0, 101, 9)]


@pytest.mark.parametrize('case', list(CASES))
def test_llama_cpp_style_file_runs_like_transformers(case, tmp_path, cache):
    conf, model = _model(case)
    path = _convert(case, conf, model, tmp_path / 'hand.gguf')
    cfg = gguf_to_safetensors(path, tmp_path / 'w.safetensors')
    want_type = {'mistral': 'llama', 'phi_fused': 'phi', 'gpt_neox_sequential': 'gpt_neox'}.get(case, case)
    assert cfg['model_type'] == want_type
    ir = build_ir(cfg)
    assert ir['config'].get('family', 'llama') == {'mistral': 'llama'}.get(want_type, want_type)
    hf = build_ir(conf.to_dict())['config']                         # the same plan as from the model's own config
    diff = {k for k in hf.keys() | ir['config'].keys() if hf.get(k) != ir['config'].get(k)}
    same = {'architectures', 'torch_dtype', 'model_type', 'rms_norm_eps'} | ({'tie_word_embeddings'} if case == 'gpt2' else set())
    assert diff <= same, diff                                       # GPT-2: the converter writes an untied copy of wte
    assert ir['config']['rms_norm_eps'] == pytest.approx(hf['rms_norm_eps'], rel=1e-6)     # stored as float32
    rt = Runtime(ir, tmp_path / 'w.safetensors', cache=cache)
    prefill_and_decode(rt, model, _prompt(3), 3, TOL, min_scale=1.0)
    rt.close()
    direct = Runtime(gguf_ir(path), path, cache=cache)              # straight on the mapped GGUF file
    prefill_and_decode(direct, model, _prompt(4), 2, TOL, min_scale=1.0)
    direct.close()


@pytest.mark.parametrize('case', list(CASES))
def test_our_writer_round_trips_and_matches_the_hand_made_file(case, tmp_path):
    conf, model = _model(case, seed=1)
    hcfg, hand = read_gguf(_convert(case, conf, model, tmp_path / 'hand.gguf'))
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items() if not k.endswith(('.attn.bias', '.attn.masked_bias'))}
    if read_config(conf.to_dict())['tie_word_embeddings']: sd.pop('lm_head.weight', None)
    got = dict(hand)
    if case == 'gpt2': assert np.array_equal(got.pop('lm_head.weight'), sd['transformer.wte.weight'])  # the converter's copy of wte
    assert sorted(got) == sorted(sd)
    for k in sd:                                     # HF layout back: exact, but for Gemma's (w + 1) - 1 in float32
        assert np.allclose(got[k], sd[k], rtol=0, atol=1e-6) if case == 'gemma' else np.array_equal(got[k], sd[k]), k
    if case == 'gpt2': sd['lm_head.weight'] = sd['transformer.wte.weight']          # written as `output`, as the converter does
    ocfg, ours = read_gguf(write_gguf(tmp_path / 'ours.gguf', conf.to_dict(), sd))
    assert read_config(ocfg) == read_config(hcfg)
    assert sorted(ours) == sorted(hand) and all(np.array_equal(ours[k], hand[k]) for k in hand)


@pytest.mark.parametrize('case', ['gpt2', 'gpt_neox', 'phi_fused', 'gemma'])
def test_quantized_matrices_run_on_their_blocks(case, tmp_path, cache):
    """Q8_0 matrices (quantized by the gguf package): the runtime straight on the file, with raw rows regrouped (NeoX) or
    split (Phi-2 fused qkv) without decoding, equals the fp32 runtime on the decoded weights; GPT-2's transposed
    matrices are decoded to fp32 (their blocks run along the other axis)."""
    conf, model = _model(case, seed=2)
    path = _convert(case, conf, model, tmp_path / 'q.gguf', quant='Q8_0')
    ir = gguf_ir(path)
    dts = ir['meta']['weight_dtypes']
    want_q8 = {'gpt2': set(), 'gpt_neox': {'w_qkv', 'wo', 'w_fc', 'w_proj', 'lm_head'}, 'phi_fused': {'wq', 'wk', 'wv', 'wo'},
               'gemma': {'wq', 'wk', 'wv', 'wo', 'w_gate', 'w_up', 'w_down'}}[case]
    assert {b for b, t in dts.items() if t == 'q8_0'} >= want_q8, dts
    if case == 'gpt2': assert dts['w_qkv'] == dts['w_fc'] == 'fp32'
    got = Runtime(ir, path, cache=cache).prefill(_prompt(5))
    cfg = gguf_to_safetensors(path, tmp_path / 'q.safetensors')
    want = Runtime(build_ir(cfg), tmp_path / 'q.safetensors', cache=cache).prefill(_prompt(5))
    assert np.abs(got - want).max() < TOL
    with torch.no_grad(): hf = model(torch.tensor([_prompt(5)])).logits[0].numpy()
    assert 1e-4 < np.abs(got - hf).max() < 0.2                      # a real quantization, close to the model


def test_family_metadata_errors_name_the_key(tmp_path):
    conf, model = _model('gpt_neox')
    path = _convert('gpt_neox', conf, model, tmp_path / 'n.gguf')
    data = path.read_bytes()
    i = data.index(b'gptneox.rope.dimension_count')                  # 4 -> 5: an odd rotary dimension
    v = i + len(b'gptneox.rope.dimension_count') + 4
    bad = tmp_path / 'bad.gguf'; bad.write_bytes(data[:v] + (5).to_bytes(4, 'little') + data[v + 4:])
    with pytest.raises(GGUFError, match=r"metadata 'gptneox.rope.dimension_count' must be an even number <= head_dim 16, got 5"):
        gguf_config(open_gguf(bad))
    w = gguf.GGUFWriter(tmp_path / 'p.gguf', 'phi2')               # a fused qkv that does not split in three
    for f, x in (('add_block_count', 1), ('add_context_length', 16), ('add_embedding_length', 64), ('add_feed_forward_length', 96),
                 ('add_head_count', 4)): getattr(w, f)(x)
    w.add_tensor('token_embd.weight', np.zeros((8, 64), np.float32)); w.add_tensor('blk.0.attn_qkv.weight', np.zeros((100, 64), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(GGUFError, match=r"tensor 'blk.0.attn_qkv.weight': 100 rows do not split into 3 equal parts"):
        read_gguf(tmp_path / 'p.gguf')
    with pytest.raises(GGUFError, match="'blk.0.ffn_gate.weight' has no HF equivalent .* architecture gpt2"):   # a Llama tensor
        w = gguf.GGUFWriter(tmp_path / 'g.gguf', 'gpt2')
        for f, x in (('add_block_count', 1), ('add_context_length', 16), ('add_embedding_length', 64), ('add_feed_forward_length', 96),
                     ('add_head_count', 4)): getattr(w, f)(x)
        w.add_tensor('token_embd.weight', np.zeros((8, 64), np.float32))
        w.add_tensor('blk.0.ffn_gate.weight', np.zeros((8, 64), np.float32))
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        read_gguf(tmp_path / 'g.gguf')


# (arch, key, writer method, value): family keys gguf_config reads, written with a wrong type or value
FAMILY_WRONG = [('gptneox', 'gptneox.use_parallel_residual', 'add_uint8', 1),
                ('gptneox', 'gptneox.rope.dimension_count', 'add_string', '4'), ('phi2', 'phi2.rope.dimension_count', 'add_int32', 40),
                ('phi2', 'phi2.attention.layer_norm_epsilon', 'add_string', '1e-5'),
                ('gpt2', 'gpt2.attention.layer_norm_epsilon', 'add_array', [1e-5]), ('gptj', 'gptj.rope.freq_base', 'add_float32', 500.0),
                ('gemma', 'gemma.attention.key_length', 'add_array', [16]),
                ('gemma', 'gemma.attention.layer_norm_rms_epsilon', 'add_bool', True)]


def _family_writer(path, arch):
    w = gguf.GGUFWriter(path, arch)
    for f, x in (('add_block_count', 1), ('add_context_length', 16), ('add_embedding_length', 64), ('add_feed_forward_length', 96),
                 ('add_head_count', 4)): getattr(w, f)(x)
    return w


@pytest.mark.parametrize('arch,key,method,value', FAMILY_WRONG, ids=[k for _, k, _, _ in FAMILY_WRONG])
def test_family_metadata_of_the_wrong_type_names_key_and_offset(tmp_path, arch, key, method, value):
    w = _family_writer(tmp_path / 'w.gguf', arch); getattr(w, method)(key, value)
    w.add_tensor('token_embd.weight', np.zeros((8, 64), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    r = open_gguf(tmp_path / 'w.gguf')
    with pytest.raises(GGUFError) as ex: gguf_config(r)
    assert f"metadata '{key}' must be" in str(ex.value) and f'at offset {r.fields[key].offset:#x}' in str(ex.value), str(ex.value)


@pytest.mark.parametrize('case', ['phi_fused', 'gpt_neox', 'gpt2'])
def test_corrupted_family_files_give_typed_errors(case, tmp_path):
    """Random bytes of the header, metadata and tensor table of a hand-made family file changed: reading and mapping
    it for the runtime raise nac_lab's typed errors only."""
    from nac_lab.binio import NacLabError
    from nac_lab.irv2.gguf_run import GGUFWeights
    conf, model = _model(case)
    data = _convert(case, conf, model, tmp_path / 'f.gguf').read_bytes()
    head = data.index(b'token_embd.weight') + 2000                   # past the tensor table
    rng = np.random.default_rng(21); p = tmp_path / 'x.gguf'
    for _ in range(60):
        b = bytearray(data)
        for _ in range(int(rng.integers(1, 4))): b[int(rng.integers(0, head))] = int(rng.integers(0, 256))
        p.write_bytes(bytes(b))
        try:
            read_gguf(p); w = GGUFWeights(p)
            for n in w.entries: w.array(n)
        except NacLabError: pass
