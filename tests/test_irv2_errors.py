"""IR v2: the builder on real configs, the strict compile, and the typed errors of every input
(config, kernel maps, IR, weights, command line)."""
import copy, json
import numpy as np
import pytest
import torch
from nac_lab.binio import NacLabError, FormatError, BadValueError
from nac_lab.core import data_path
from nac_lab.cli import run_cli
from nac_lab.irv2.maps import (ConfigError, MapError, IrError, WeightError, CodegenError, RuntimeFailure, load_maps, copy_maps)
from nac_lab.irv2.build import build_ir, save_ir, load_ir, validate_ir, read_config
from nac_lab.irv2.codegen import emit_c, compile_c
from nac_lab.irv2.run import weights_image, random_weights, save_weights, SafeTensors, Runtime

QWEN = data_path('irv2', 'configs', 'qwen2-0.5b.json')
LLAMA = data_path('irv2', 'configs', 'tiny-llama.json')


def test_qwen2_dimensions_and_counts():
    ir = build_ir(QWEN)
    dims = {d['name']: d['value'] for d in ir['dimensions']}
    assert [d['id'] for d in ir['dimensions']] == list(range(11))
    assert dims == dict(tokens=131072, embed=896, aligned_embed=896, head_dim=64, aligned_head=64, num_heads=14,
                        num_kv_heads=2, aligned_ctx=131072, intermediate=4864, aligned_intermediate=4864, vocab=151936)
    assert ir['meta']['parameters'] == 494_032_768          # Qwen2-0.5B's published parameter count
    assert len([n for n in ir['nodes'] if n['layer'] == -1]) == 3
    assert {n['layer'] for n in ir['nodes']} == set(range(-1, 24))
    by = {b['name']: b for b in ir['buffers']}
    assert by['wk']['resolved_shape'] == [2, 64, 896] and by['rope_cos']['resolved_shape'] == [131072, 32]
    assert by['rope_cos']['shape'][1] == {'dim': 3, 'mult': 1, 'div': 2}


def test_alignment_of_unaligned_dims():
    ir = build_ir(LLAMA, ctx=20)
    dims = {d['name']: d['value'] for d in ir['dimensions']}
    assert (dims['aligned_embed'], dims['aligned_head'], dims['aligned_ctx'], dims['aligned_intermediate']) == (80, 16, 32, 208)
    plan = ir['meta']['memory_plan']
    for arena in ('weights', 'activations'):
        offs = [e['offset'] for k in ('global', 'layer', 'scratch') for e in plan[arena].get(k, [])]
        assert all(o % 64 == 0 for o in offs) and plan[arena]['total'] % 64 == 0
    # layer blocks do not overlap: stride covers the last buffer of the block
    last = plan['weights']['layer'][-1]
    assert plan['weights']['layer_stride'] >= last['offset'] + last['bytes']


@pytest.mark.parametrize('cfg', [QWEN, LLAMA, data_path('irv2', 'configs', 'tiny-qwen2.json'), data_path('irv2', 'configs',
                                                                                                         'bench-20m.json')])
@pytest.mark.parametrize('openmp', [False, True])
def test_generated_c_compiles_warning_free(cfg, openmp, tmp_path):
    src = tmp_path/'m.c'
    src.write_text(emit_c(build_ir(cfg, ctx=128 if cfg == QWEN else None)))
    compile_c(src, tmp_path/'m.so', openmp=openmp)          # raises on any diagnostic (-Werror, and stderr must be empty)
    assert (tmp_path/'m.so').stat().st_size > 0


def test_compile_c_reports_errors(tmp_path):
    (tmp_path/'x.c').write_text('int f(int a) { return; }\n')
    with pytest.raises(CodegenError, match='x.c'):
        compile_c(tmp_path/'x.c', tmp_path/'x.so')


@pytest.mark.parametrize('edit, msg', [
    (lambda c: c.pop('hidden_size'), "missing field 'hidden_size'"),
    (lambda c: c.pop('num_attention_heads'), "missing field 'num_attention_heads'"),
    (lambda c: c.update(n_embd=128), 'contradictory values for hidden_size'),
    (lambda c: c.update(n_layer=3), 'contradictory values for num_hidden_layers'),
    (lambda c: c.update(num_key_value_heads=4), 'not a multiple of num_key_value_heads=4'),
    (lambda c: c.update(num_attention_heads=5, num_key_value_heads=5), 'not divisible by num_attention_heads=5'),
    (lambda c: c.update(vocab_size=-1), 'vocab_size must be a positive integer'),
    (lambda c: c.update(hidden_act='relu'), "hidden_act='relu' is not supported"),
    (lambda c: c.update(mlp_bias='yes'), 'mlp_bias must be true or false'),
    (lambda c: c.update(rope_scaling={'rope_type': 'yarn', 'factor': 4.0}),
     "rope_scaling.original_max_position_embeddings is required for rope_type 'yarn'"),
    (lambda c: c.update(rope_scaling={'rope_type': 'longrope', 'factor': 4.0}), "rope_scaling.rope_type='longrope' is not supported"),
    (lambda c: c.update(rope_theta=1e4, rotary_emb_base=5e5), 'contradictory values for rope_theta'),
    (lambda c: c.update(rms_norm_eps=0), 'rms_norm_eps must be > 0'),
])
def test_config_errors(edit, msg):
    cfg = json.loads(LLAMA.read_text()); edit(cfg)
    with pytest.raises(ConfigError, match=None) as ei:
        build_ir(cfg)
    assert msg in str(ei.value)
    assert isinstance(ei.value, NacLabError)


def test_config_file_errors(tmp_path):
    (tmp_path/'c.json').write_text('{"hidden_size": 64,\n "n_layer": }')
    with pytest.raises(ConfigError, match=r'c.json:2:13: invalid config'):
        read_config(tmp_path/'c.json')
    with pytest.raises(ConfigError, match='config: top level must be an object, not list'):
        read_config([1, 2])


def _maps_with(tmp_path, fname, fn):
    copy_maps(tmp_path, lambda n, d: fn(d) if n == fname else None)
    return load_maps(tmp_path)


def test_map_errors(tmp_path):
    def unknown_dim(d): d['buffers'][0]['shape'][0]['dim'] = 'hidden'
    with pytest.raises(MapError, match=r"unknown dimension 'hidden'"):
        _maps_with(tmp_path/'a', 'decoder_layer_plan.json', unknown_dim)
    def unknown_buf(d): d['steps'][1]['bind']['wq'] = 'w_q'
    with pytest.raises(MapError, match=r"argument 'wq' bound to unknown buffer 'w_q'"):
        _maps_with(tmp_path/'b', 'decoder_layer_plan.json', unknown_buf)
    def unknown_global_buf(d): d['epilogue'][1]['bind']['w'] = 'lm_head_w'
    with pytest.raises(MapError, match=r"epilogue\[1\] \(linear\): argument 'w' bound to unknown buffer 'lm_head_w'"):
        _maps_with(tmp_path/'c', 'global_buffers.json', unknown_global_buf)
    def schema(d): d['version'] = 2
    with pytest.raises(MapError, match=r'at \$.version'):
        _maps_with(tmp_path/'d', 'global_buffers.json', schema)
    def bad_param(d): d['params'][0]['from'] = 'epsilon'
    with pytest.raises(MapError, match="unknown config field 'epsilon'"):
        _maps_with(tmp_path/'e', 'kernels/rmsnorm.json', bad_param)
    # an alias must share its target's scope (a layer buffer has one copy per layer, a global one a single copy)
    def cross_scope(d): next(b for b in d['buffers'] if b['name'] == 'lm_head')['alias']['of'] = 'w_up'
    with pytest.raises(MapError, match=r"'lm_head': alias of 'w_up' whose scope differs \(global vs layer\)"):
        _maps_with(tmp_path/'f', 'global_buffers.json', cross_scope)


def test_custom_maps_are_used(tmp_path):
    """A map edit changes the IR: dropping the RoPE step from a copy of the maps drops the node."""
    def no_rope(d): d['steps'] = [s for s in d['steps'] if s['kernel'] != 'rope']
    maps = _maps_with(tmp_path, 'decoder_layer_plan.json', no_rope)
    ir = build_ir(LLAMA, maps=maps)
    assert 'rope' not in {n['op'] for n in ir['nodes']}
    assert ir['meta']['kernel_maps'] == str(tmp_path)


def test_ir_errors(tmp_path):
    ir = build_ir(LLAMA)
    bad = copy.deepcopy(ir); bad['nodes'][4]['bindings'][0]['buffer'] = 'qq'
    with pytest.raises(IrError, match=r"bound to unknown buffer 'qq'"):
        emit_c(bad)
    bad = copy.deepcopy(ir); bad['buffers'][2]['alias_of'] = 'nothing'
    with pytest.raises(IrError, match="alias of unknown buffer 'nothing'"):
        validate_ir(bad)
    bad = copy.deepcopy(ir); bad['dimensions'] = bad['dimensions'][:10]
    with pytest.raises(IrError, match='at \\$.dimensions'):
        validate_ir(bad)
    bad = copy.deepcopy(ir); bad['nodes'][0]['layer'] = 7
    with pytest.raises(IrError, match='beyond num_hidden_layers=2'):
        validate_ir(bad)
    (tmp_path/'ir.json').write_text(json.dumps(ir)[:-5])
    with pytest.raises(IrError, match=r'ir.json:1:\d+: invalid IR'):
        load_ir(tmp_path/'ir.json')
    (tmp_path/'dir.json').mkdir()
    with pytest.raises(IrError, match=r'dir.json: cannot read IR'):
        load_ir(tmp_path/'dir.json')
    # a binding to a buffer of the wrong rank is a CodegenError naming node and buffer, not a ValueError from unpacking
    bad = copy.deepcopy(ir)
    for n in bad['nodes']:
        if n['op'] == 'attention':
            next(b for b in n['bindings'] if b['arg'] == 'k_cache')['buffer'] = 'hidden'
    with pytest.raises(CodegenError, match=r"attention_forward\): buffer 'hidden' has 2 axes .* the kernel needs 3"):
        emit_c(bad)
    # a RoPE table with fewer rows than the context length would be read past its end at run time
    ctx = ir['dimensions'][0]['value']
    bad = copy.deepcopy(ir)
    for b in bad['buffers']:
        if b['name'] in ('rope_cos', 'rope_sin'): b['shape'][0]['div'] = 4; b['resolved_shape'][0] = ctx // 4
    with pytest.raises(CodegenError,
                       match=rf"\(layer 0, rope, rope_forward\): RoPE table 'rope_cos' has {ctx // 4} rows but positions run up to the "
                             rf"context length {ctx}"):
        emit_c(bad)
    # a condition nested past the recursion limit is a MapError, not a RecursionError
    bad = copy.deepcopy(ir); bad['nodes'][1]['condition'] = '(' * 3000 + 'qkv_bias' + ')' * 3000
    with pytest.raises(MapError, match='nested too deeply'):
        validate_ir(bad)


@pytest.fixture
def llama_weights(tmp_path):
    ir = build_ir(LLAMA)
    return ir, random_weights(ir, seed=0)


def test_weight_errors(tmp_path, llama_weights):
    ir, sd = llama_weights
    bad = dict(sd); del bad['lm_head.weight']; save_weights(bad, tmp_path/'a.safetensors')
    with pytest.raises(WeightError, match=r"tensor 'lm_head.weight' \(buffer lm_head\) is missing"):
        weights_image(ir, tmp_path/'a.safetensors')
    bad = dict(sd); bad['model.layers.1.self_attn.q_proj.weight'] = torch.zeros(72, 70); save_weights(bad, tmp_path/'b.safetensors')
    with pytest.raises(WeightError, match=r"q_proj.weight' \(buffer wq, layer 1\) has shape \[72, 70\] but the IR expects \[6, 12, 72\]"):
        weights_image(ir, tmp_path/'b.safetensors')
    bad = dict(sd); bad['model.layers.0.mlp.down_proj.weight'] = sd['model.layers.0.mlp.down_proj.weight'].T.copy()
    save_weights(bad, tmp_path/'c.safetensors')
    with pytest.raises(WeightError, match=r'has shape \[200, 72\] but the IR expects \[72, 200\]'):
        weights_image(ir, tmp_path/'c.safetensors')
    with pytest.raises(FileNotFoundError):
        weights_image(ir, tmp_path/'nope.safetensors')


def test_safetensors_corruption(tmp_path, llama_weights):
    ir, sd = llama_weights
    raw = save_weights(sd, tmp_path/'w.safetensors').read_bytes()
    n = int.from_bytes(raw[:8], 'little')
    cases = {
        'short': raw[:5],
        'len': (len(raw)).to_bytes(8, 'little') + raw[8:],
        'json': raw[:8] + b'{' + b' ' * (n - 1) + raw[8 + n:],
        'trunc': raw[:8 + n + 10],
    }
    for k, blob in cases.items():
        (tmp_path/f'{k}.safetensors').write_bytes(blob)
        with pytest.raises(FormatError):
            SafeTensors(tmp_path/f'{k}.safetensors')


@pytest.mark.parametrize('change,cls,msg', [
    ({'data_offsets': [False, 4]}, BadValueError, r'data_offsets must be \[begin, end\] integers, got \[False, 4\]'),
    ({'data_offsets': [0, True]}, BadValueError, r'data_offsets must be \[begin, end\] integers'),
    ({'shape': [True]}, BadValueError, 'shape must be a list of non-negative integers'),
    ({'extra': 1}, BadValueError, 'entry must have exactly dtype, shape and data_offsets'),
    ({'__metadata__': 1}, BadValueError, '__metadata__ must be an object of strings'),
])
def test_safetensors_header_is_strict(tmp_path, change, cls, msg):
    "The loader shares binio's strict header parser: no bool offsets or sizes, no extra entry keys, string metadata."
    hdr = {'w': {'dtype': 'F32', 'shape': [1], 'data_offsets': [0, 4]}}
    if '__metadata__' in change: hdr.update(change)
    else: hdr['w'].update(change)
    j = json.dumps(hdr).encode()
    p = tmp_path/'w.safetensors'; p.write_bytes(len(j).to_bytes(8, 'little') + j + bytes(4))
    with pytest.raises(cls, match=msg) as ei: SafeTensors(p)
    assert ei.value.offset == 8 and ei.value.section == ("__metadata__" if '__metadata__' in change else "tensor 'w'")
    assert ei.value.fmt == 'safetensors w.safetensors'
    ok = json.dumps({'w': {'dtype': 'F32', 'shape': [1], 'data_offsets': [0, 4]}}).encode()     # control: the unchanged entry loads
    p.write_bytes(len(ok).to_bytes(8, 'little') + ok + bytes(4))
    assert SafeTensors(p).entries == {'w': ('F32', (1,), 8 + len(ok), 4)}


def test_runtime_errors(tmp_path, llama_weights):
    ir, sd = llama_weights
    rt = Runtime(ir, save_weights(sd, tmp_path/'w.safetensors'), cache=tmp_path/'cache')
    with pytest.raises(RuntimeFailure, match=r'prompt token 1 = 300 is not a token id'):
        rt.prefill([1, 300])
    with pytest.raises(RuntimeFailure, match='non-empty'):
        rt.prefill([])
    with pytest.raises(RuntimeFailure, match='weights buffer has the wrong size'):
        Runtime(ir, np.zeros(10, np.float32), cache=tmp_path/'cache')
    # C-level checks, bypassing Python's
    assert rt.lib.nac_decode(rt.m, -1) == -1
    assert not rt.lib.nac_logits(rt.m, 0)      # nothing computed yet: NULL
    rt.prefill([1, 2, 3])
    assert rt.lib.nac_logits(rt.m, 2) and rt.lib.nac_logits(rt.m, -1) and not rt.lib.nac_logits(rt.m, 3)
    rt.close()


def test_runtime_refuses_arenas_larger_than_memory(monkeypatch, llama_weights, tmp_path):
    import nac_lab.irv2.run as run
    ir, sd = llama_weights
    monkeypatch.setattr(run, 'physical_memory', lambda: 100_000)
    with pytest.raises(RuntimeFailure, match=r'the arenas need [\d,]+ bytes but this machine has 100,000'):
        run.Runtime(ir, np.zeros(1, np.float32), cache=tmp_path)


def test_cli_pipeline_and_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli('irv2', 'build', QWEN, '-o', 'q.json')
    assert rc == 0 and 'qwen2, 24 layers' in out and '494,032,768 parameters' in out
    assert load_ir('q.json')['dimensions'][10]['value'] == 151936
    rc, out, err = run_cli('irv2', 'build', LLAMA, '--ctx', 16, '--dtype', 'bf16', '-o', 'b.json')
    assert rc == 0
    rc, out, err = run_cli('irv2', 'emit', 'b.json', '-o', 'b.c')
    assert rc == 1 and 'rebuild the IR with --dtype fp32' in err
    rc, out, err = run_cli('irv2', 'build', LLAMA, '--ctx', 1000, '-o', 'x.json')
    assert rc == 1 and 'exceeds max_position_embeddings=64' in err and err.count('\n') == 1
    rc, out, err = run_cli('irv2', 'build', LLAMA, '--ctx', 16, '-o', 'l.json')
    ir = load_ir('l.json'); sd = random_weights(ir, 1); save_weights(sd, 'w.safetensors')
    rc, out, err = run_cli('irv2', 'run', 'l.json', 'w.safetensors', '--tokens', '5,6,7', '--steps', 3, '--cache', 'cache')
    assert rc == 0 and len(out.strip().split(',')) == 3
    rc, out, err = run_cli('irv2', 'run', 'l.json', 'w.safetensors', '--tokens', '5,6,7', '--steps', -1, '--cache', 'cache')
    assert rc == 1 and '--steps must be >= 0' in err
    del sd['model.norm.weight']; save_weights(sd, 'w2.safetensors')
    rc, out, err = run_cli('irv2', 'run', 'l.json', 'w2.safetensors', '--tokens', '5', '--cache', 'cache')
    assert rc == 1 and "'model.norm.weight' (buffer final_norm) is missing" in err


def test_other_families():
    """SmolLM-135M (Llama family, tied, GQA 9:3) and Mistral-7B-v0.1 (sliding window 4096) as published."""
    smol = dict(architectures=['LlamaForCausalLM'], model_type='llama', hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, max_position_embeddings=2048, rms_norm_eps=1e-5,
                rope_theta=10000.0, tie_word_embeddings=True, hidden_act='silu')
    ir = build_ir(smol)
    assert ir['meta']['parameters'] == 134_515_008                  # SmolLM-135M's parameter count
    assert [d['value'] for d in ir['dimensions']] == [2048, 576, 576, 64, 64, 9, 3, 2048, 1536, 1536, 49152]
    mistral = dict(architectures=['MistralForCausalLM'], model_type='mistral', hidden_size=4096, intermediate_size=14336,
                   num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                   max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096,
                   tie_word_embeddings=False, hidden_act='silu')
    assert build_ir(mistral)['config']['sliding_window'] == 4096        # the full 32k context reads the last 4096 keys
    ir = build_ir(mistral, ctx=4096)
    assert 'sliding_window' not in ir['config']                      # a context within the window needs none
    assert ir['meta']['parameters'] == 7_241_732_096                # Mistral-7B's parameter count
    assert {b['name'] for b in ir['buffers'] if b['role'] == 'weight'} >= {'lm_head', 'token_emb'}
    assert next(b for b in ir['buffers'] if b['name'] == 'lm_head')['alias_of'] is None


@pytest.mark.parametrize('edit, msg', [
    ({'rope_parameters': {'rope_theta': 'x'}}, "rope_parameters: rope_theta must be a finite number, got 'x'"),
    ({'sliding_window': 'x', 'use_sliding_window': True}, "sliding_window must be a positive integer or null, got 'x'"),
    ({'max_position_embeddings': 10**15}, 'max_position_embeddings=1000000000000000 exceeds 2147483647'),
    ({'intermediate_size': 10**12}, 'intermediate_size=1000000000000 exceeds 2147483647'),
])
def test_cli_build_rejects_bad_field_types_and_sizes(edit, msg, tmp_path):
    """Review findings: these escaped as internal errors, or built an IR whose C fails to compile (int overflow)."""
    cfg = {**json.loads(LLAMA.read_text()), **edit}
    (tmp_path/'c.json').write_text(json.dumps(cfg))
    rc, out, err = run_cli('irv2', 'build', tmp_path/'c.json', '-o', tmp_path/'ir.json')
    assert rc == 1 and msg in err and len(err.strip().splitlines()) == 1 and 'internal error' not in err
    assert not (tmp_path/'ir.json').exists()


def test_cli_run_context_overflow_is_one_clear_line(tmp_path):
    ir = build_ir(LLAMA, ctx=16)
    save_ir(ir, tmp_path/'ir.json'); save_weights(random_weights(ir, seed=1), tmp_path/'w.safetensors')
    rc, out, err = run_cli('irv2', 'run', tmp_path/'ir.json', tmp_path/'w.safetensors', '--tokens', '1,2,3', '--steps', 15,
                           '--cache', tmp_path/'cache')
    assert rc == 1 and '3 prompt tokens + 15 steps need 17 positions but the IR was built for a context of 16' in err
    rc, out, err = run_cli('irv2', 'run', tmp_path/'ir.json', tmp_path/'w.safetensors', '--tokens', '1,2,3', '--steps', 14,
                           '--cache', tmp_path/'cache')
    assert rc == 0 and len(out.strip().split(',')) == 14
