"""The generated C under AddressSanitizer + UndefinedBehaviorSanitizer: both tiny configs, compiled with
`-fsanitize=address,undefined -fno-sanitize-recover=all`, loaded through the ctypes runner in a child
Python with the sanitizer runtimes preloaded, prefill + decode up to the last position of the context.
Any sanitizer report aborts the child (non-zero exit, report on stderr); the tokens are compared with the
independent PyTorch reference in the parent."""
import json, os, subprocess, sys
import pytest
from nac_lab.core import data_path
from nac_lab.irv2.build import build_ir
from nac_lab.irv2.run import TorchReference, random_weights

CTX, PROMPT, STEPS = 32, list(range(1, 17)), 17      # 16 + 17 - 1 = 32 positions: the whole context

CHILD = r'''
import json, os, sys
from nac_lab.core import data_path
from nac_lab.irv2.build import build_ir
from nac_lab.irv2.run import Runtime, random_weights, save_weights
name, ctx, prompt, steps, tmp = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ir = build_ir(name if os.path.isabs(name) else data_path('irv2', 'configs', name), ctx=ctx)
w = save_weights(random_weights(ir, seed=2), tmp + '/w.safetensors')
rt = Runtime(ir, w, cache=tmp + '/cache',
             extra=('-fsanitize=address,undefined', '-fno-sanitize-recover=all', '-fno-omit-frame-pointer', '-g'))
toks = rt.generate(prompt, steps)
rt.prefill([3]); rt.decode(4)                 # a second sequence on the same model
print(json.dumps({'tokens': toks, 'position': rt.position}))
'''


def _runtimes():
    try:
        libs = [subprocess.run(['cc', f'-print-file-name={n}'], capture_output=True, text=True, check=True).stdout.strip()
                for n in ('libasan.so', 'libubsan.so')]
    except (OSError, subprocess.CalledProcessError):
        return None
    return libs if all(os.path.isabs(p) and os.path.exists(p) for p in libs) else None


@pytest.mark.parametrize('name', ['tiny-qwen2.json', 'tiny-llama.json'])
def test_generated_c_is_sanitizer_clean(name, tmp_path):
    libs = _runtimes()
    if libs is None: pytest.skip('the C compiler has no AddressSanitizer/UBSan runtime')
    env = {**os.environ, 'LD_PRELOAD': ' '.join(libs), 'ASAN_OPTIONS': 'detect_leaks=0:abort_on_error=0',
           'UBSAN_OPTIONS': 'print_stacktrace=1'}
    r = subprocess.run([sys.executable, '-c', CHILD, name, str(CTX), json.dumps(PROMPT), str(STEPS), str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert 'Sanitizer' not in r.stderr and 'runtime error' not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    ir = build_ir(data_path('irv2', 'configs', name), ctx=CTX)
    assert got['tokens'] == TorchReference(ir['config'], random_weights(ir, seed=2)).generate(PROMPT, STEPS)
    assert got['position'] == 2


FAMILIES = {'gpt2': dict(model_type='gpt2', n_embd=32, n_layer=2, n_head=4, n_positions=32, vocab_size=64),
            'gpt_neox': dict(model_type='gpt_neox', hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=48, vocab_size=64, max_position_embeddings=32),
            'gptj': dict(model_type='gptj', n_embd=32, n_layer=2, n_head=4, n_positions=32, vocab_size=64, rotary_dim=4),
            'gemma': dict(model_type='gemma', hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                          head_dim=16, intermediate_size=48, vocab_size=64, max_position_embeddings=32)}


@pytest.mark.parametrize('family', list(FAMILIES))
def test_family_c_is_sanitizer_clean(family, tmp_path):
    """The family kernels (irv2.families: LayerNorm, GELU, fused split, learned positions, partial and interleaved rotary,
    embedding scale) through the whole context under the sanitizers; tokens as the same C built without them."""
    from nac_lab.irv2.run import Runtime, save_weights
    libs = _runtimes()
    if libs is None: pytest.skip('the C compiler has no AddressSanitizer/UBSan runtime')
    cfg = tmp_path / f'{family}.json'; cfg.write_text(json.dumps(FAMILIES[family]))
    env = {**os.environ, 'LD_PRELOAD': ' '.join(libs), 'ASAN_OPTIONS': 'detect_leaks=0:abort_on_error=0',
           'UBSAN_OPTIONS': 'print_stacktrace=1'}
    r = subprocess.run([sys.executable, '-c', CHILD, str(cfg), str(CTX), json.dumps(PROMPT), str(STEPS), str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert 'Sanitizer' not in r.stderr and 'runtime error' not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    ir = build_ir(cfg, ctx=CTX)
    plain = Runtime(ir, save_weights(random_weights(ir, seed=2), tmp_path / 'p.safetensors'), cache=tmp_path / 'plain')
    assert got['tokens'] == plain.generate(PROMPT, STEPS) and got['position'] == 2
