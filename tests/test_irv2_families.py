"""IR v2 decoder families beyond plain Llama: scaled RoPE (linear, dynamic NTK, YaRN, Llama-3), Mistral's sliding
window and GeGLU MLPs (gelu, tanh-GELU). Each runs the generated C runtime against HuggingFace transformers' model with
the same random weights — prefill, then decode through the KV cache on both sides — logits within 1e-4 (fp32) and
greedy tokens identical; dynamic NTK runs past the original context so that its frequencies change between calls."""
import numpy as np
import pytest
import torch
from nac_lab.irv2.build import build_ir
from nac_lab.irv2.run import Runtime, TorchReference, random_weights, save_weights
from hf_parity import prefill_and_decode

transformers = pytest.importorskip('transformers')
TOL = 1e-4
BASE = dict(model_type='llama', hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=101, max_position_embeddings=16, rms_norm_eps=1e-5, tie_word_embeddings=False)
KINDS = {'linear': {'factor': 2.0},
         'llama3': {'factor': 4.0, 'low_freq_factor': 1.0, 'high_freq_factor': 4.0, 'original_max_position_embeddings': 8},
         'yarn': {'factor': 2.0, 'original_max_position_embeddings': 8, 'beta_fast': 8.0, 'beta_slow': 1.0},
         'dynamic': {'factor': 2.0}}


@pytest.fixture(scope='module')
def cache(tmp_path_factory): return tmp_path_factory.mktemp('rope_cache')


def _hf(cfg, sd):
    conf = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != 'model_type'})
    conf._attn_implementation = 'eager'
    model = transformers.LlamaForCausalLM(conf).float().eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    assert not missing and not unexpected
    return model


@pytest.mark.parametrize('kind', list(KINDS))
def test_scaled_rope_matches_transformers(kind, tmp_path, cache):
    cfg = {**BASE, 'rope_parameters': {'rope_type': kind, 'rope_theta': 1000.0, **KINDS[kind]}}
    ctx = 28 if kind == 'dynamic' else 16                 # dynamic: beyond max_position_embeddings (16)
    ir = build_ir(cfg, ctx=ctx)
    assert ir['config']['rope_scaling']['type'] == kind
    sd = random_weights(ir, seed=11)
    rt = Runtime(ir, save_weights(sd, tmp_path / 'w.safetensors'), cache=cache)
    model = _hf(cfg, sd)
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, 101, 12 if kind != 'dynamic' else 18)]
    prefill_and_decode(rt, model, prompt, 4 if kind != 'dynamic' else 8, TOL)     # greedy decode through both KV caches
    rt.close()


def test_reference_follows_the_scaling():
    """The package's own torch reference applies the same scaled frequencies (it is what the benchmarks compare to)."""
    cfg = {**BASE, 'rope_parameters': {'rope_type': 'yarn', 'rope_theta': 1000.0, **KINDS['yarn']}}
    ir = build_ir(cfg); sd = random_weights(ir, seed=2)
    prompt = list(range(1, 13))
    with torch.no_grad():
        hf = _hf(cfg, sd)(torch.tensor([prompt])).logits[0]
    assert torch.allclose(TorchReference(ir['config'], sd).forward(prompt), hf, atol=TOL)


def test_refusals():
    from nac_lab.irv2.maps import ConfigError
    with pytest.raises(ConfigError, match="rope_type='longrope' is not supported"):
        build_ir({**BASE, 'rope_scaling': {'rope_type': 'longrope', 'factor': 2.0}})
    with pytest.raises(ConfigError, match='exceeds max_position_embeddings=16 times the RoPE scaling factor 2.0'):
        build_ir({**BASE, 'rope_parameters': {'rope_type': 'dynamic', 'rope_theta': 1e4, 'factor': 2.0}}, ctx=40)
    with pytest.raises(ConfigError, match='exceeds max_position_embeddings=16'):
        build_ir(BASE, ctx=20)


def test_mistral_sliding_window_matches_transformers(tmp_path, cache):
    """Mistral's sliding window (each query reads the last `sliding_window` keys) against transformers' Mistral, with a
    window of 5 on a 16-token context: prefill 11 tokens, decode 4 through both KV caches."""
    cfg = {**BASE, 'model_type': 'mistral', 'sliding_window': 5, 'rope_theta': 1000.0}
    ir = build_ir(cfg)
    assert ir['config']['sliding_window'] == 5
    sd = random_weights(ir, seed=5)
    rt = Runtime(ir, save_weights(sd, tmp_path / 'w.safetensors'), cache=cache)
    conf = transformers.MistralConfig(**{k: v for k, v in cfg.items() if k != 'model_type'})
    conf._attn_implementation = 'eager'
    model = transformers.MistralForCausalLM(conf).float().eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    assert not missing and not unexpected
    prompt = [int(t) for t in np.random.default_rng(8).integers(0, 101, 11)]
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
    assert np.abs(rt.prefill(prompt) - out.logits[0].numpy()).max() < TOL
    full = build_ir({**cfg, 'sliding_window': None})      # the window matters: full attention gives other logits
    assert 'sliding_window' not in full['config']
    past = out.past_key_values
    for tok in (3, 14, 15, 92):
        with torch.no_grad():
            out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        assert np.abs(rt.decode(tok) - out.logits[0, -1].numpy()).max() < TOL
    ref = TorchReference(ir['config'], sd).forward(prompt + [3, 14, 15, 92]).numpy()
    with torch.no_grad():
        hf_full = model(torch.tensor([prompt + [3, 14, 15, 92]])).logits[0].numpy()
    assert np.abs(ref - hf_full).max() < TOL
    rt.close()


@pytest.mark.parametrize('act', ['gelu', 'gelu_pytorch_tanh'])
def test_geglu_matches_transformers(act, tmp_path, cache):
    """A Llama whose gated MLP uses GELU (GeGLU: exact erf form, or the tanh approximation of Gemma)."""
    cfg = {**BASE, 'hidden_act': act, 'rope_theta': 1000.0}
    ir = build_ir(cfg)
    assert ir['config']['hidden_act'] == act
    sd = random_weights(ir, seed=4)
    rt = Runtime(ir, save_weights(sd, tmp_path / 'w.safetensors'), cache=cache)
    model = _hf(cfg, sd)
    prompt = [int(t) for t in np.random.default_rng(6).integers(0, 101, 10)]
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
    assert np.abs(rt.prefill(prompt) - out.logits[0].numpy()).max() < TOL
    with torch.no_grad():
        nxt = model(torch.tensor([[7]]), past_key_values=out.past_key_values, use_cache=True).logits[0, -1].numpy()
    assert np.abs(rt.decode(7) - nxt).max() < TOL
    silu = Runtime(build_ir({**cfg, 'hidden_act': 'silu'}), save_weights(sd, tmp_path / 'w2.safetensors'), cache=cache)
    assert np.abs(silu.prefill(prompt) - out.logits[0].numpy()).max() > 10 * TOL      # the activation matters
    assert torch.allclose(TorchReference(ir['config'], sd).forward(prompt), out.logits[0], atol=TOL)
    rt.close(); silu.close()


def test_hand_edited_scaling_is_refused_by_the_schema():
    """An IR file whose rope_scaling lacks a field its kind needs fails validation by name (not a KeyError in codegen)."""
    import copy
    from nac_lab.irv2.build import validate_ir
    from nac_lab.irv2.maps import IrError
    ir = build_ir({**BASE, 'rope_parameters': {'rope_type': 'llama3', 'rope_theta': 1000.0, **KINDS['llama3']}})
    validate_ir(ir)
    bad = copy.deepcopy(ir); del bad['config']['rope_scaling']['low_freq_factor']
    with pytest.raises(IrError, match='low_freq_factor'):
        validate_ir(bad)
    bad = copy.deepcopy(ir); bad['config']['rope_scaling']['factor'] = 'big'
    with pytest.raises(IrError, match='rope_scaling'):
        validate_ir(bad)


def test_mlp_bias_matches_transformers(tmp_path, cache):
    """Llama's `mlp_bias` (with `attention_bias`): gate and up become two biased `linear` steps instead of the fused
    `gate_up` kernel, and down_proj gets its bias; the C runtime (one sequence, batched, and q8_0 matrices) and the torch
    reference follow transformers' Llama through prefill and decode."""
    from nac_lab.irv2.batch import BatchRuntime
    from nac_lab.irv2.build import validate_ir
    from nac_lab.irv2.qkernels import set_weight_dtypes
    cfg = {**BASE, 'mlp_bias': True, 'attention_bias': True, 'rope_theta': 1000.0}
    ir = build_ir(cfg)
    assert ir['config']['mlp_bias'] is True and 'mlp_bias' not in build_ir(BASE)['config']
    ops = [n['op'] for n in ir['nodes'] if n['layer'] == 0]
    assert ops[ops.index('rmsnorm', 1):] == ['rmsnorm', 'mlp_gate', 'mlp_up', 'swiglu', 'mlp_down', 'residual_add']
    down = next(n for n in ir['nodes'] if n['op'] == 'mlp_down')
    assert {b['arg']: b['buffer'] for b in down['bindings']}['b'] == 'b_down' and down['flags'] == 1
    sd = random_weights(ir, seed=12)
    assert sd['model.layers.1.mlp.up_proj.bias'].shape == (96,) and np.abs(sd['model.layers.1.mlp.up_proj.bias']).max() > 0
    w = save_weights(sd, tmp_path / 'w.safetensors')
    rt, model = Runtime(ir, w, cache=cache), _hf(cfg, sd)
    prompt = [int(t) for t in np.random.default_rng(13).integers(0, 101, 9)]
    prefill_and_decode(rt, model, prompt, 4, TOL)
    with torch.no_grad():
        hf = model(torch.tensor([prompt])).logits[0]
    assert torch.allclose(TorchReference(ir['config'], sd).forward(prompt), hf, atol=TOL)
    nobias = {k: v for k, v in sd.items() if not k.endswith('mlp.up_proj.bias')}
    with pytest.raises(Exception, match='up_proj.bias'):          # a plan that needs a bias reads it from the file
        Runtime(ir, save_weights(nobias, tmp_path / 'n.safetensors'), cache=cache)
    two = BatchRuntime(build_ir(cfg, batch=2), w, cache=cache)
    got = two.prefill_batch([prompt, prompt[:4]])
    assert np.abs(got[0] - hf.numpy()).max() < TOL and np.abs(got[1] - hf.numpy()[:4]).max() < TOL
    q8 = set_weight_dtypes(ir, 'q8_0')
    validate_ir(q8)
    assert {b['name']: b['dtype'] for b in q8['buffers']}['b_gate'] == 'fp32'     # vectors stay fp32
    diff = np.abs(Runtime(q8, w, cache=cache).prefill(prompt) - hf.numpy()).max()
    assert TOL < diff < 0.05 * np.abs(hf.numpy()).max()                 # quantized, yet the same model
    import copy
    from nac_lab.irv2.maps import IrError
    lost = copy.deepcopy(ir); del lost['config']['mlp_bias']              # a hand-edited IR that lost its flag
    with pytest.raises(IrError, match="'b_gate': condition 'mlp_bias' is false for this config"):
        validate_ir(lost)
    rt.close(); two.close()
