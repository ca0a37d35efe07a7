"""IR v2's decoder families beyond Llama (`irv2.families`): GPT-2 (learned positions, Conv1D weights, fused [q|k|v]),
GPT-NeoX (fused per-head qkv, partial rotary, parallel and sequential residual), GPT-J (interleaved partial rotary,
parallel block), Phi (one LayerNorm, parallel block, partial rotary, lm_head bias) and Gemma ((1 + w) RMSNorm, scaled
embedding, GeGLU, multi-query attention). Each is
built from transformers' own config (`to_dict()`), run by the generated C runtime and compared with transformers'
model holding the same random weights: prefill, then greedy decode through both KV caches, logits within 1e-4
(fp32). Also: older checkpoint names, the batched runtime, q8_0 matrices after the Conv1D transpose, and the settings
that are refused."""
import numpy as np
import pytest
import torch
from nac_lab.irv2.batch import BatchRuntime
from nac_lab.irv2.build import build_ir
from nac_lab.irv2.maps import ConfigError
from nac_lab.irv2.run import Runtime, random_weights, save_weights
from hf_parity import prefill_and_decode

transformers = pytest.importorskip('transformers')
TOL = 1e-4
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, vocab_size=101,
             max_position_embeddings=16)
CASES = {
    'gpt2': lambda: (transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=16, vocab_size=101),
                     transformers.GPT2LMHeadModel),
    'gpt_neox_parallel': lambda: (transformers.GPTNeoXConfig(**SMALL), transformers.GPTNeoXForCausalLM),
    'gpt_neox_sequential': lambda: (transformers.GPTNeoXConfig(**SMALL, use_parallel_residual=False, rotary_pct=0.5,
                                                               rotary_emb_base=500.0), transformers.GPTNeoXForCausalLM),
    'gptj': lambda: (transformers.GPTJConfig(n_embd=64, n_layer=2, n_head=4, n_positions=16, vocab_size=101, rotary_dim=8),
                     transformers.GPTJForCausalLM),
    'phi': lambda: (transformers.PhiConfig(**SMALL), transformers.PhiForCausalLM),
    'gemma': lambda: (transformers.GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=24), transformers.GemmaForCausalLM),
}


@pytest.fixture(scope='module')
def cache(tmp_path_factory): return tmp_path_factory.mktemp('ln_families')


def _hf(conf, cls, sd, tied):
    conf._attn_implementation = 'eager'
    model = cls(conf).float().eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    assert not unexpected and set(missing) <= ({'lm_head.weight'} if tied else set())
    if tied: model.tie_weights()
    return model


def _prompt(n, seed): return [int(t) for t in np.random.default_rng(seed).integers(0, 101, n)]


@pytest.mark.parametrize('case', list(CASES))
def test_family_matches_transformers(case, tmp_path, cache):
    conf, cls = CASES[case]()
    ctx = 13 if case == 'gpt2' else None          # GPT-2: fewer positions than the table has (leading_rows)
    ir = build_ir(conf.to_dict(), ctx=ctx)
    assert ir['config']['family'] == case.split('_p')[0].split('_s')[0]
    sd = random_weights(ir, seed=7)
    if case == 'gpt2':                              # HF wants the whole position table
        sd['transformer.wpe.weight'] = np.concatenate([sd['transformer.wpe.weight'],
                                                       np.ones((3, 64), np.float32)])
    rt = Runtime(ir, save_weights(sd, tmp_path / 'w.safetensors'), cache=cache)
    model = _hf(conf, cls, sd, ir['config']['tie_word_embeddings'])
    prefill_and_decode(rt, model, _prompt(9, 3), 4, TOL, min_scale=1.0)
    rt.close()


def test_the_settings_matter(tmp_path, cache):
    """Parallel vs sequential residual and the rotated fraction each change the logits (so the parity tests can fail)."""
    base = transformers.GPTNeoXConfig(**SMALL).to_dict()
    ir = build_ir(base); sd = random_weights(ir, seed=2); w = save_weights(sd, tmp_path / 'w.safetensors')
    ref = Runtime(ir, w, cache=cache).prefill(_prompt(6, 1))
    for change in ({'use_parallel_residual': False}, {'rope_parameters': {**base['rope_parameters'], 'partial_rotary_factor': 0.5}}):
        other = build_ir({**base, **change})
        assert np.abs(Runtime(other, w, cache=cache).prefill(_prompt(6, 1)) - ref).max() > 100 * TOL
    gemma = transformers.GemmaConfig(**SMALL, num_key_value_heads=2).to_dict()      # Gemma's (1 + w) norms and sqrt(hidden) embedding scale
    ir = build_ir(gemma); w = save_weights(random_weights(ir, seed=2), tmp_path / 'g.safetensors')
    assert ir['config']['embedding_scale'] == 8.0
    as_llama = build_ir({**gemma, 'model_type': 'llama'})
    assert np.abs(Runtime(ir, w, cache=cache).prefill(_prompt(6, 1)) - Runtime(as_llama, w, cache=cache).prefill(_prompt(6, 1))).max() > 0.1


def test_older_checkpoint_names(tmp_path, cache):
    """GPT-2 files without the `transformer.` prefix and GPT-NeoX files with `embed_out` load as the current names do."""
    for conf, rename in ((CASES['gpt2']()[0], lambda k: k.removeprefix('transformer.')),
                         (CASES['gpt_neox_parallel']()[0], lambda k: k.replace('lm_head.', 'embed_out.'))):
        ir = build_ir(conf.to_dict()); sd = random_weights(ir, seed=4)
        a = Runtime(ir, save_weights(sd, tmp_path / 'a.safetensors'), cache=cache).prefill(_prompt(5, 2))
        old = {rename(k): v for k, v in sd.items()}
        assert set(old) != set(sd)
        b = Runtime(ir, save_weights(old, tmp_path / 'b.safetensors'), cache=cache).prefill(_prompt(5, 2))
        assert np.array_equal(a, b)


@pytest.mark.parametrize('case', ['gpt2', 'gptj', 'phi'])
def test_batched_runtime_matches_alone(case, tmp_path, cache):
    """Learned positions (GPT-2), interleaved (GPT-J) and partial rotary (Phi) per row of a batch: each sequence as when it runs alone."""
    conf = CASES[case]()[0].to_dict()
    ir1, irb = build_ir(conf), build_ir(conf, batch=2)
    w = save_weights(random_weights(ir1, seed=9), tmp_path / 'w.safetensors')
    one, two = Runtime(ir1, w, cache=cache), BatchRuntime(irb, w, cache=cache)
    prompts = [_prompt(7, 5), _prompt(3, 6)]
    got = two.prefill_batch(prompts)
    for p, g in zip(prompts, got):
        assert np.abs(one.prefill(p) - g).max() < 1e-5
    one.prefill(prompts[1])
    step = two.decode_batch([11, 12])
    assert np.abs(one.decode(12) - step[1]).max() < 1e-5


def test_q8_0_after_transpose(tmp_path, cache):
    """GPT-2's Conv1D matrices are transposed before they are quantized: the q8_0 runtime equals the fp32 runtime run on
    the same weights dequantized (and stored back in the Conv1D layout)."""
    from nac_lab.irv2.qkernels import set_weight_dtypes
    from nac_lab.irv2.quant import dequantize, quantize
    ir = build_ir(CASES['gpt2']()[0].to_dict())
    sd = random_weights(ir, seed=3)
    q8 = set_weight_dtypes(ir, 'q8_0')
    kinds = {b['tensor']: b for b in q8['buffers'] if b['dtype'] == 'q8_0'}
    assert 'transformer.h.{layer}.attn.c_attn.weight' in kinds
    deq = {}
    for k, v in sd.items():
        b = next((b for t, b in kinds.items() if t.replace('{layer}', k.split('.')[2] if '.h.' in k else '') == k), None)
        if b is None: deq[k] = v; continue
        m = v.T if b.get('transform') == 'transpose' else v
        d = dequantize(quantize(np.ascontiguousarray(m), 'Q8_0'), 'Q8_0', m.shape)
        deq[k] = np.ascontiguousarray(d.T if b.get('transform') == 'transpose' else d)
    w = save_weights(sd, tmp_path / 'w.safetensors')
    got = Runtime(q8, w, cache=cache).prefill(_prompt(6, 4))
    ref = Runtime(ir, save_weights(deq, tmp_path / 'd.safetensors'), cache=cache).prefill(_prompt(6, 4))
    plain = Runtime(ir, w, cache=cache).prefill(_prompt(6, 4))
    assert np.abs(got - ref).max() < TOL < np.abs(got - plain).max()


def test_refusals():
    phi, gpt2 = CASES['phi']()[0].to_dict(), CASES['gpt2']()[0].to_dict()
    with pytest.raises(ConfigError, match='qk_layernorm=True is not supported'):
        build_ir({**phi, 'qk_layernorm': True})
    with pytest.raises(ConfigError, match="hidden_act='relu' is not supported for gpt2"):
        build_ir({**gpt2, 'activation_function': 'relu'})
    with pytest.raises(ConfigError, match='scale_attn_by_inverse_layer_idx=True is not supported'):
        build_ir({**gpt2, 'scale_attn_by_inverse_layer_idx': True})
    with pytest.raises(ConfigError, match='dynamic NTK RoPE with a partial rotary dimension'):
        build_ir({**phi, 'rope_parameters': {**phi['rope_parameters'], 'rope_type': 'dynamic', 'factor': 2.0}})
    with pytest.raises(ConfigError, match='exceeds max_position_embeddings=16'):
        build_ir(gpt2, ctx=20)
    gptj = CASES['gptj']()[0].to_dict()
    with pytest.raises(ConfigError, match='rotary_dim must be an even integer in \\[2, head_dim=16\\], got None'):
        build_ir({**gptj, 'rotary_dim': None})
    with pytest.raises(ConfigError, match='gptj has a fixed RoPE base of 10000'):
        build_ir({**gptj, 'rope_theta': 500.0})
    with pytest.raises(ConfigError, match="model_type='qwen3' is not supported"):
        build_ir({**phi, 'model_type': 'qwen3'})
