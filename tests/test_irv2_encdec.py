"""IR v2 encoder-decoder (T5) and encoder (BERT) against HF transformers, and the training plan (grad buffers).

Tiny T5 models with random weights (HF `T5ForConditionalGeneration`, re-initialised with a seeded generator so that
greedy decoding does not collapse to one token) are built, emitted, compiled with -Wall -Wextra -Werror and run:
encoder output and per-step logits within 1e-4 of HF (relative to the largest logit where it exceeds 1), greedy
tokens equal to HF's (full recomputation at every step), once under ASan/UBSan. BERT (`BertModel`, random weights,
token types): last hidden state within 1e-4.
The training plan: the decoder-only and T5 IRs built with train=True validate, lay
out a grads arena, and their forward runtime gives the same logits as the inference IR."""
import json, os, subprocess, sys
import numpy as np
import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration
from nac_lab.core import data_path
from nac_lab.irv2.build import build_ir
from nac_lab.irv2.encdec import build_encdec_ir, save_encdec_ir, validate_encdec_ir
from nac_lab.irv2.encdec_c import EncDecRuntime
from nac_lab.irv2.maps import IrError, RuntimeFailure
from nac_lab.irv2.run import Runtime, random_weights, save_weights

BASE = dict(vocab_size=96, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=3, num_heads=4, dropout_rate=0.0,
            relative_attention_num_buckets=16, relative_attention_max_distance=32, decoder_start_token_id=0)
VARIANTS = {'t5-relu-tied': dict(feed_forward_proj='relu'),
            't5v1.1-gated-gelu-untied': dict(feed_forward_proj='gated-gelu', tie_word_embeddings=False)}
TOL, ENC = 1e-4, [5, 9, 3, 17, 42, 8, 1, 30, 11, 2, 7, 63, 0, 4, 19, 25, 77, 90, 33, 6, 12, 50, 21, 14, 88, 3, 60, 2, 45, 9, 70, 31, 16, 8]


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp('encdec_cache')


def _hf(variant, seed=1):
    cfg = {**BASE, **VARIANTS[variant]}
    torch.manual_seed(0)
    hf = T5ForConditionalGeneration(T5Config(**cfg)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for k, p in hf.named_parameters():
            z = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * z if 'layer_norm' in k else 2 * z if 'relative' in k else z if 'shared' in k else 2 * z / p.shape[-1] ** 0.5)
    return cfg, hf


def _setup(variant, tmp, cache, ctx=24, enc_ctx=40, **kw):
    cfg, hf = _hf(variant)
    ir = build_encdec_ir(cfg, ctx=ctx, enc_ctx=enc_ctx, **kw)
    w = save_weights({k: v.detach().clone() for k, v in hf.state_dict().items()}, tmp/'w.safetensors')
    return cfg, hf, ir, w, EncDecRuntime(ir, w, cache=cache)


def _hf_greedy(hf, ids, steps):
    seq = [0]
    with torch.no_grad():
        for _ in range(steps):
            seq.append(int(hf(input_ids=torch.tensor([ids]), decoder_input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[1:]


@pytest.mark.parametrize('variant', list(VARIANTS))
def test_logits_and_greedy_match_transformers(variant, tmp_path, cache):
    cfg, hf, ir, w, rt = _setup(variant, tmp_path, cache)
    dec = [0, 12, 33, 4, 50, 6, 7, 8, 21, 13, 90, 1]
    enc = rt.encode(ENC)
    steps = np.concatenate([rt.decode([t]) for t in dec])          # one token at a time: the KV cache
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ENC]), decoder_input_ids=torch.tensor([dec]))
    assert np.abs(enc - ref.encoder_last_hidden_state[0].numpy()).max() < TOL
    scale = max(1.0, float(np.abs(ref.logits).max()))               # untied T5 v1.1 logits reach ~25: 1e-4 of that
    assert np.abs(steps - ref.logits[0].numpy()).max() < TOL * scale
    rt.encode(ENC)                                                   # a new sequence, all decoder tokens at once
    assert np.abs(rt.decode(dec) - ref.logits[0].numpy()).max() < TOL * scale
    toks = rt.generate(ENC, 10)
    assert toks == _hf_greedy(hf, ENC, 10)
    assert len(set(toks)) > 1                                        # not a degenerate fixed point


def test_errors(tmp_path, cache):
    cfg, hf, ir, w, rt = _setup('t5-relu-tied', tmp_path, cache, ctx=4, enc_ctx=8)
    with pytest.raises(RuntimeFailure, match='decode before encode'): rt.decode([1])
    with pytest.raises(RuntimeFailure, match='exceed the 8 positions'): rt.encode(list(range(9)))
    rt.encode([1, 2, 3])
    rt.decode([0, 1, 2, 3])
    with pytest.raises(RuntimeFailure, match='exceed the 0 positions'): rt.decode([1])
    with pytest.raises(RuntimeFailure, match='not a token id'): rt.encode([96])
    bad = json.loads(json.dumps(ir)); bad['nodes'][5]['bindings'][0]['buffer'] = 'd_ln1'
    with pytest.raises(IrError, match='outside a layer of that stack'): validate_encdec_ir(bad)
    bad = json.loads(json.dumps(ir)); bad['dimensions'][11]['value'] = 9
    with pytest.raises(IrError, match='dimension table does not match'): validate_encdec_ir(bad)
    with pytest.raises(IrError, match='decoder-only IR|not an op of the kernel maps'):
        from nac_lab.irv2.build import validate_ir
        validate_ir(ir)


CHILD = r'''
import json, sys
from nac_lab.irv2.encdec_c import EncDecRuntime
tmp, enc = sys.argv[1], json.loads(sys.argv[2])
rt = EncDecRuntime(tmp + '/ir.json', tmp + '/w.safetensors', cache=tmp + '/cache',
                   extra=('-fsanitize=address,undefined', '-fno-sanitize-recover=all', '-fno-omit-frame-pointer', '-g'))
toks = rt.generate(enc, 8)                      # fills the decoder context and the encoder context exactly
rt.encode(enc[:3]); rt.decode([0, 5])
b = EncDecRuntime(tmp + '/bert.json', tmp + '/bert.safetensors', cache=tmp + '/cache',
                  extra=('-fsanitize=address,undefined', '-fno-sanitize-recover=all', '-fno-omit-frame-pointer', '-g'))
h = b.encode([t % 60 for t in enc[:32]], [i % 3 for i in range(32)])     # the whole encoder context
print(json.dumps({'tokens': toks, 'bert': h.tolist()}))
'''


def test_sanitizer_clean(tmp_path):
    try:
        libs = [subprocess.run(['cc', f'-print-file-name={n}'], capture_output=True, text=True, check=True).stdout.strip()
                for n in ('libasan.so', 'libubsan.so')]
    except (OSError, subprocess.CalledProcessError):
        libs = []
    if len(libs) != 2 or not all(os.path.isabs(p) and os.path.exists(p) for p in libs): pytest.skip('no ASan/UBSan runtime')
    cfg, hf = _hf('t5v1.1-gated-gelu-untied')
    save_encdec_ir(build_encdec_ir(cfg, ctx=8, enc_ctx=len(ENC)), tmp_path/'ir.json')
    save_weights({k: v.detach().clone() for k, v in hf.state_dict().items()}, tmp_path/'w.safetensors')
    bert, bir = _bert('gelu')
    save_encdec_ir(bir, tmp_path/'bert.json')
    save_weights({k: v.detach().clone() for k, v in bert.state_dict().items()}, tmp_path/'bert.safetensors')
    env = {**os.environ, 'LD_PRELOAD': ' '.join(libs), 'ASAN_OPTIONS': 'detect_leaks=0', 'UBSAN_OPTIONS': 'print_stacktrace=1'}
    r = subprocess.run([sys.executable, '-c', CHILD, str(tmp_path), json.dumps(ENC)], capture_output=True, text=True, env=env, timeout=300)
    assert 'Sanitizer' not in r.stderr and 'runtime error' not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got['tokens'] == _hf_greedy(hf, ENC, 8)
    with torch.no_grad():
        want = bert(input_ids=torch.tensor([[t % 60 for t in ENC[:32]]]),
                    token_type_ids=torch.tensor([[i % 3 for i in range(32)]])).last_hidden_state[0].numpy()
    assert np.abs(np.array(got['bert']) - want).max() < TOL


def test_cli_build_emit_run_and_train(tmp_path, cache, capsys, monkeypatch):
    from nac_lab.cli import main
    cfg, hf = _hf('t5-relu-tied')
    (tmp_path/'config.json').write_text(json.dumps({**cfg, 'model_type': 't5'}))
    save_weights({k: v.detach().clone() for k, v in hf.state_dict().items()}, tmp_path/'w.safetensors')
    monkeypatch.chdir(tmp_path)
    def cli(*a):
        rc = main(['irv2', *a]); out = capsys.readouterr()
        assert rc in (0, None), out.err
        return out.out
    out = cli('build', 'config.json', '--ctx', '16', '--enc-ctx', '40', '--train', '-o', 'ir.json')
    assert 'grads' in out and 't5' in out
    ir = json.loads((tmp_path/'ir.json').read_text())
    assert {b['role'] for b in ir['buffers']} == {'weight', 'activation', 'grad'} and 'grads' in ir['meta']['memory_plan']
    cli('emit', 'ir.json', '-o', 'model.c')
    assert 'nac_encode' in (tmp_path/'model.c').read_text()
    out = cli('run', 'ir.json', 'w.safetensors', '--tokens', ','.join(map(str, ENC[:20])), '--steps', '6', '--cache', str(cache))
    assert [int(t) for t in out.strip().split(',')] == _hf_greedy(hf, ENC[:20], 6)


def test_training_plan_keeps_the_forward(tmp_path, cache):
    cfgp = data_path('irv2', 'configs', 'tiny-llama.json')
    inf, tr = build_ir(cfgp, ctx=32), build_ir(cfgp, ctx=32, train=True)
    w = save_weights(random_weights(inf, seed=3), tmp_path/'l.safetensors')
    prompt = list(range(1, 13))
    a, b = Runtime(inf, w, cache=cache).prefill(prompt), Runtime(tr, w, cache=cache).prefill(prompt)
    assert np.array_equal(a, b)
    L = tr['config']['num_hidden_layers']
    g = tr['meta']['memory_plan']['grads']
    assert g['total'] == g['layer_base'] + L * g['layer_stride'] and g['total'] >= 4 * tr['meta']['parameters']
    cfg, hf, ir, w2, rt = _setup('t5-relu-tied', tmp_path, cache, ctx=8, enc_ctx=16, train=True)
    names = {b['name'] for b in ir['buffers'] if b['role'] == 'grad'}
    assert {'grad_shared', 'grad_e_wq', 'grad_x_wk', 'grad_hidden', 'grad_enc_hidden'} <= names and 'grad_lm_head' not in names
    assert ir['meta']['training']['checkpoints'] == ['hidden_ckpt0', 'hidden_ckpt1', 'hidden_ckpt2', 'enc_hidden_ckpt0', 'enc_hidden_ckpt1']
    rt.encode(ENC[:16])
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ENC[:16]]), decoder_input_ids=torch.tensor([[0, 5, 6]])).logits[0].numpy()
    assert np.abs(rt.decode([0, 5, 6]) - ref).max() < TOL
    save_encdec_ir(ir, tmp_path/'t.json')


BERT = dict(model_type='bert', vocab_size=60, hidden_size=48, num_hidden_layers=3, num_attention_heads=6, intermediate_size=80,
            max_position_embeddings=40, type_vocab_size=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _bert(act):
    from transformers import BertConfig, BertModel
    cfg = {**BERT, 'hidden_act': act}
    torch.manual_seed(0)
    hf = BertModel(BertConfig(**cfg), add_pooling_layer=False).eval()
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for k, p in hf.named_parameters():
            z = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * z if 'LayerNorm.weight' in k else 0.1 * z if k.endswith('bias') else z if 'embeddings' in k
                    else 2 * z / p.shape[-1] ** 0.5)
    return hf, build_encdec_ir(cfg, enc_ctx=32)


@pytest.mark.parametrize('act', ['gelu', 'gelu_new'])
def test_bert_last_hidden_state_matches_transformers(act, tmp_path, cache):
    hf, ir = _bert(act)
    rt = EncDecRuntime(ir, save_weights({k: v.detach().clone() for k, v in hf.state_dict().items()}, tmp_path/'b.safetensors'), cache=cache)
    rng = np.random.default_rng(5)
    for n in (1, 17, 32):
        ids, types = rng.integers(0, 60, n).tolist(), rng.integers(0, 3, n).tolist()
        with torch.no_grad():
            want = hf(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types])).last_hidden_state[0].numpy()
        assert np.abs(rt.encode(ids, types) - want).max() < TOL
    with torch.no_grad():
        want = hf(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
    assert np.abs(rt.encode(ids) - want).max() < TOL                     # token types default to 0 as in HF
    with pytest.raises(RuntimeFailure, match='has no decoder'): rt.decode([1])
