"""IR v2 end to end: the generated C runtime against an independent PyTorch implementation (and against
`transformers`, where installed) on the tiny Llama-style and Qwen2-style configs: prefill 16 tokens, decode 8,
logits within 1e-4 max abs, greedy tokens identical."""
import json
import numpy as np
import pytest
import torch
from nac_lab.core import data_path
from nac_lab.irv2.build import build_ir
from nac_lab.irv2.run import Runtime, TorchReference, random_weights, save_weights

CONFIGS = ['tiny-llama.json', 'tiny-qwen2.json']
TOL = 1e-4


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp('irv2_cache')


def _setup(name, tmp, cache, seed=0, **kw):
    ir = build_ir(data_path('irv2', 'configs', name), **kw)
    sd = random_weights(ir, seed=seed)
    w = save_weights(sd, tmp/'w.safetensors')
    return ir, sd, w, Runtime(ir, w, cache=cache)


def _prompt(ir, seed=0, n=16):
    return [int(t) for t in np.random.default_rng(seed).integers(0, ir['config']['vocab_size'], n)]


@pytest.mark.parametrize('name', CONFIGS)
def test_parity_prefill_decode(name, tmp_path, cache):
    ir, sd, w, rt = _setup(name, tmp_path, cache)
    ref = TorchReference(ir['config'], sd)
    prompt = _prompt(ir)
    c = rt.prefill(prompt)
    r = ref.forward(prompt).numpy()
    assert c.shape == (16, ir['config']['vocab_size'])
    assert np.abs(r).max() > 1.0                      # the logits are not trivially small
    assert np.abs(c - r).max() < TOL
    seq = list(prompt)
    last = c[-1]
    for _ in range(8):
        nxt = int(np.argmax(last))
        assert nxt == int(np.argmax(ref.forward(seq)[-1].numpy()))
        seq.append(nxt)
        last = rt.decode(nxt)
        assert np.abs(last - ref.forward(seq)[-1].numpy()).max() < TOL
    assert rt.position == 24


@pytest.mark.parametrize('name', CONFIGS)
def test_greedy_tokens_identical(name, tmp_path, cache):
    ir, sd, w, rt = _setup(name, tmp_path, cache, seed=3)
    prompt = _prompt(ir, seed=5)
    got = rt.generate(prompt, 8)
    assert got == TorchReference(ir['config'], sd).generate(prompt, 8)
    # a second prefill restarts the sequence: same answer again
    assert rt.generate(prompt, 8) == got


def test_reference_cache_matches_recompute():
    """The reference's incremental decode (used by the benchmark) equals its full recomputation."""
    ir = build_ir(data_path('irv2', 'configs', 'tiny-llama.json'))
    ref = TorchReference(ir['config'], random_weights(ir, seed=2))
    toks = _prompt(ir, n=12)
    cache = ref.new_cache()
    ref.forward(toks[:8], cache)
    inc = [ref.forward([t], cache)[-1] for t in toks[8:]]
    full = ref.forward(toks)[8:]
    assert torch.allclose(torch.stack(inc), full, atol=1e-5)


def test_config_variants_gqa_and_mha(tmp_path, cache):
    """Alternative key names + text_config nesting, GQA 4:2 with an unaligned head_dim (12), and plain MHA."""
    base = json.loads(data_path('irv2', 'configs', 'tiny-llama.json').read_text())
    nested = {'model_type': 'llama', 'text_config': {'n_embd': 48, 'n_layer': 1, 'n_head': 4, 'num_kv_heads': 2, 'ffn_dim': 100,
                                                     'vocab_size': 97, 'n_positions': 32, 'norm_eps': 1e-5, 'rotary_emb_base': 500.0}}
    for i, cfg in enumerate([nested, {**base, 'num_key_value_heads': 6}]):
        ir = build_ir(cfg)
        sd = random_weights(ir, seed=10 + i)
        rt = Runtime(ir, save_weights(sd, tmp_path/f'w{i}.safetensors'), cache=cache)
        ref = TorchReference(ir['config'], sd)
        toks = _prompt(ir, n=10)
        assert np.abs(rt.prefill(toks) - ref.forward(toks).numpy()).max() < TOL
        toks.append(3)
        assert np.abs(rt.decode(3) - ref.forward(toks)[-1].numpy()).max() < TOL


def test_openmp_build_matches(tmp_path, cache):
    ir, sd, w, rt = _setup('tiny-qwen2.json', tmp_path, cache)
    omp = Runtime(ir, w, cache=cache, openmp=True)
    p = _prompt(ir)
    assert np.abs(rt.prefill(p) - omp.prefill(p)).max() < 1e-5


def _hf_model(ir, sd):
    transformers = pytest.importorskip('transformers')
    cfg = dict(json.loads(data_path('irv2', 'configs', ir['meta']['source_config']).read_text()))
    cfg.pop('architectures', None); cfg.pop('torch_dtype', None)
    kind = cfg.pop('model_type')
    conf_cls = {'llama': transformers.LlamaConfig, 'qwen2': transformers.Qwen2Config}[kind]
    model_cls = {'llama': transformers.LlamaForCausalLM, 'qwen2': transformers.Qwen2ForCausalLM}[kind]
    conf = conf_cls(**cfg)
    conf._attn_implementation = 'eager'
    model = model_cls(conf).float().eval()
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    assert not unexpected
    assert set(missing) <= {'lm_head.weight'}           # tied: lm_head shares embed_tokens
    return model


@pytest.mark.parametrize('name', CONFIGS)
def test_against_transformers(name, tmp_path, cache):
    """Cross-check against HuggingFace transformers' own Llama / Qwen2 models (skipped when not installed)."""
    ir, sd, w, rt = _setup(name, tmp_path, cache, seed=7)
    model = _hf_model(ir, sd)
    prompt = _prompt(ir, seed=9)
    with torch.no_grad():
        hf = model(torch.tensor([prompt])).logits[0].numpy()
    assert np.abs(rt.prefill(prompt) - hf).max() < TOL
    seq = list(prompt)
    for t in [1, 2, 3]:
        seq.append(t)
        with torch.no_grad():
            hf_last = model(torch.tensor([seq])).logits[0, -1].numpy()
        assert np.abs(rt.decode(t) - hf_last).max() < TOL
