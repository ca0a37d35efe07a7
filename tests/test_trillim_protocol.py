"""Protocol v1 golden tests: the exact --config vector (§2), argv (§1), request bytes and response handling (§3),
and the real engine's behaviour on malformed input (never a hang)."""
import io, json, subprocess, sys, textwrap
import pytest

from nac_lab.trillim.config import arch_from_hf, config_args, parse_config_args, ArchConfigError, eos_from_tokenizer, load_hf_config
from nac_lab.trillim.client import TrillimClient, engine_argv, request_bytes, Sampling, EngineDied, ProtocolError, EngineTimeout
from nac_lab.trillim.manifest import tiny_checkpoint, build_manifest
from nac_lab.trillim.files import quantize
from nac_lab.trillim.engine import engine_main

QWEN2 = dict(architectures=['Qwen2ForCausalLM'], model_type='qwen2', hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
             num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-06,
             rope_theta=1000000.0, tie_word_embeddings=True, eos_token_id=151645)
BITNET = dict(architectures=['BitNetForCausalLM'], model_type='bitnet', hidden_size=2560, intermediate_size=6912, num_hidden_layers=30,
              num_attention_heads=20, num_key_value_heads=5, vocab_size=128256, max_position_embeddings=4096, rms_norm_eps=1e-05,
              rope_theta=500000.0, tie_word_embeddings=True, eos_token_id=128001)

def tokenizer(tmp_path, added):
    p = tmp_path/'tokenizer.json'
    p.write_text(json.dumps({'added_tokens': [{'id': i, 'content': c, 'special': True} for c, i in added], 'model': {'vocab': {}}}))
    return p

def test_config_vector_qwen2_golden(tmp_path):
    tok = tokenizer(tmp_path, [('<|endoftext|>', 151643), ('<|im_start|>', 151644), ('<|im_end|>', 151645)])
    c = arch_from_hf(QWEN2, tokenizer_eos=eos_from_tokenizer(tok))
    assert config_args(c) == ['2', '1', '896', '4864', '24', '14', '2', '151936', '64', '32768', '1e-06', '1000000.0',
                              '1', '1', '0', '0', '0', '2', '151645', '151643']

def test_config_vector_bitnet_golden(tmp_path):
    tok = tokenizer(tmp_path, [('<|end_of_text|>', 128001), ('<|eot_id|>', 128009), ('<|begin_of_text|>', 128000)])
    c = arch_from_hf(BITNET, tokenizer_eos=eos_from_tokenizer(tok))
    assert config_args(c, num_threads=6) == ['1', '0', '2560', '6912', '30', '20', '5', '128256', '128', '4096', '1e-05',
                                             '500000.0', '1', '0', '1', '1', '6', '2', '128001', '128009']

def test_config_unaligned_sizes_and_eos_limit():
    c = arch_from_hf(dict(QWEN2, hidden_size=1000, intermediate_size=3000, num_attention_heads=10, num_key_value_heads=5, head_dim=100))
    assert config_args(c)[2:4] == ['1024', '3072'] and config_args(c)[8] == '100'
    with pytest.raises(ArchConfigError, match='at most 8'): arch_from_hf(dict(QWEN2, eos_token_id=list(range(9))))
    assert len(config_args(arch_from_hf(dict(QWEN2, eos_token_id=list(range(8)))))) == 18 + 8

def test_engine_argv_golden():
    c = arch_from_hf(BITNET)
    assert engine_argv('/opt/darknet/inference', '/models/bitnet', c, lora=True) == [
        '/opt/darknet/inference', '/models/bitnet', '--lora', '--config', '1', '0', '2560', '6912', '30', '20', '5', '128256',
        '128', '4096', '1e-05', '500000.0', '1', '0', '1', '1', '0', '1', '128001']
    assert engine_argv(['x', 'y'], 'd', c)[:4] == ['x', 'y', 'd', '--config']
    assert parse_config_args(config_args(c)).eos_tokens == [128001]

def test_request_bytes_golden():
    s = Sampling(temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.1, rep_penalty_lookback=64, max_tokens=4)
    assert request_bytes([10, 20, 30], True, s) == b'3\n1\n0.7\n40\n0.9\n1.1\n64\n4\n10\n20\n30\n'
    assert request_bytes([99], False, Sampling()) == b'1\n0\n0.0\n0\n1.0\n1.0\n64\n0\n99\n'

# ---------------------------------------------------------------------------------------------------------------
# a fake engine that records exactly what the client sends and answers from a script

FAKE = textwrap.dedent('''
    import json, sys
    log, script = sys.argv[1], json.loads(sys.argv[2])
    args = sys.argv[3:]
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    rec = open(log, 'wb')
    rec.write((json.dumps(args) + '\\n').encode()); rec.flush()
    for answer in script:
        first = inp.readline(); rec.write(first); rec.flush()
        if first.strip() == b'0' or not first: break
        n = int(first)
        for _ in range(7 + n): rec.write(inp.readline())
        rec.flush()
        if answer == 'DIE': sys.stderr.write('fake: out of memory\\n'); sys.exit(9)
        out.write(''.join(f'{v}\\n' for v in answer).encode()); out.flush()
    else:
        rec.write(inp.readline())
    rec.close()
''')

def fake_client(tmp_path, script, cfg=None, timeout=30):
    f = tmp_path/'fake.py'; f.write_text(FAKE)
    log = tmp_path/'log'
    cfg = cfg or arch_from_hf(dict(QWEN2, vocab_size=1000, eos_token_id=[7, 8]))
    cl = TrillimClient('/models/q', cfg, lora=True, cmd=[sys.executable, str(f), str(log), json.dumps(script)], timeout=timeout)
    return cl, log

def test_client_wire_bytes_and_prefix_reuse(tmp_path):
    cl, log = fake_client(tmp_path, [[11, 12, 8, 5], [13, 14, 15, 16, 7, 10], [21, 7, 3]])
    s = dict(temperature=0.7, top_k=40, top_p=0.9, repetition_penalty=1.1, rep_penalty_lookback=64, max_tokens=4)
    got = []
    for t in cl.generate([10, 20, 30], **s): got.append(t)
    assert got == [11, 12] and cl.last == 'eos' and cl.kv_position == 5 and cl.cached == [10, 20, 30, 11, 12]
    # the sampled EOS (8) is not in the cache: the next turn sends only the new token, reset 0
    got = cl.complete([10, 20, 30, 11, 12, 99])
    assert got == [13, 14, 15, 16] and cl.last == 'eos' and cl.kv_position == 10
    # history that diverges from the cache -> full resend with reset 1; max_tokens hit -> synthetic EOS (4th line)
    got = cl.complete([10, 20, 31], max_tokens=1)
    assert got == [21] and cl.last == 'max_tokens' and cl.kv_position == 1 + 2 and cl.cached == [10, 20, 31]
    assert cl.close() == 0
    lines = log.read_bytes().split(b'\n', 1)
    assert json.loads(lines[0]) == ['/models/q', '--lora', '--config'] + config_args(cl.cfg)
    assert lines[1] == (b'3\n1\n0.7\n40\n0.9\n1.1\n64\n4\n10\n20\n30\n'
                        b'1\n0\n0.0\n0\n1.0\n1.0\n64\n0\n99\n'
                        b'3\n1\n0.0\n0\n1.0\n1.0\n64\n1\n10\n20\n31\n'
                        b'0\n')

def test_client_engine_without_synthetic_eos(tmp_path):
    cl, log = fake_client(tmp_path, [[11, 12, 13, 5]])
    assert cl.complete([1, 2, 3], max_tokens=3) == [11, 12, 13] and cl.last == 'max_tokens' and cl.kv_position == 5
    cl.close()

def test_client_dead_engine_and_bad_output(tmp_path):
    cl, _ = fake_client(tmp_path, ['DIE'])
    with pytest.raises(EngineDied, match=r'code 9.*fake: out of memory'): cl.complete([1])
    cl, _ = fake_client(tmp_path, [['eleven']])
    with pytest.raises(ProtocolError, match="'eleven'"): cl.complete([1])
    cl.kill()
    cl, _ = fake_client(tmp_path, [[11, 7, 40]])
    with pytest.raises(ProtocolError, match='KV position 40'): cl.complete([1, 2])
    cl.kill()
    with pytest.raises(EngineDied, match='cannot start'):
        TrillimClient('/m', cl.cfg, cmd=['/nonexistent/inference'])

def test_client_timeout(tmp_path):
    cfg = arch_from_hf(dict(QWEN2, vocab_size=1000, eos_token_id=[7]))
    cl = TrillimClient('/m', cfg, cmd=[sys.executable, '-c', 'import sys, time; sys.stdin.readline(); time.sleep(60)'], timeout=0.5)
    with pytest.raises(EngineTimeout): cl.complete([1])
    assert cl.proc.poll() is not None

# ---------------------------------------------------------------------------------------------------------------
# the real engine as a subprocess

@pytest.fixture(scope='module')
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp('trillim')/'m'
    tiny_checkpoint(d, arch='bitnet', layers=1, vocab=128, eos=127, max_pos=32)
    cfg = load_hf_config(d); quantize(build_manifest(d, cfg=cfg), cfg, d)
    return d, cfg

def run_engine(model, stdin, extra=(), cfg_args=None, in_process=False):
    """Run the engine on `stdin` bytes: as a real subprocess (bounded by a timeout), or in-process through the same
    `engine_main` with in-memory streams (cheap: no interpreter and torch start-up per case)."""
    d, cfg = model
    argv = [str(d), *extra, '--config', *(cfg_args or config_args(cfg))]
    if in_process:
        o, e = io.BytesIO(), io.StringIO()
        rc = engine_main(argv, io.BytesIO(stdin), o, e)
        return rc, o.getvalue().decode(), e.getvalue()
    p = subprocess.run([sys.executable, '-m', 'nac_lab.trillim.engine', *argv], input=stdin, capture_output=True, timeout=120)
    return p.returncode, p.stdout.decode(), p.stderr.decode()

def test_engine_session_quit_and_max_tokens(model):
    rc, out, err = run_engine(model, b'2\n1\n0.0\n0\n1.0\n1.0\n64\n3\n5\n6\n' + b'1\n0\n0.0\n0\n1.0\n1.0\n64\n2\n9\n' + b'0\n')
    assert (rc, err) == (0, '')
    v = [int(x) for x in out.split()]
    assert len(v) == 3 + 1 + 1 + 2 + 1 + 1
    assert v[3] == 127 and v[4] == 2 + 3 - 1            # synthetic EOS, then kv_position
    assert v[7] == 127 and v[8] == 4 + 1 + 2 - 1

def test_engine_context_full_ends_with_eos(model):
    toks = b''.join(b'%d\n' % i for i in range(30))
    rc, out, err = run_engine(model, in_process=True, stdin=b'30\n1\n0.0\n0\n1.0\n1.0\n64\n0\n' + toks + b'0\n')
    v = [int(x) for x in out.split()]
    assert rc == 0 and v[-2] == 127 and v[-1] == 32     # 30 + 3 samples fill 32 positions (last sample not fed)

@pytest.mark.parametrize('stdin,msg', [
    (b'2\n1\n0.0\n0\n1.0\n1.0\n64\n5\n1\n', 'end of input while reading token 2 of 2'),
    (b'1\n1\n0.0\n0\n', 'end of input while reading top_p (line 5)'),
    (b'abc\n', "expected an integer, got 'abc'"),
    (b'1\n3\n0.0\n0\n1.0\n1.0\n64\n5\n1\n', 'reset_flag must be 0 or 1'),
    (b'1\n1\n-1\n0\n1.0\n1.0\n64\n5\n1\n', 'temperature must be >= 0'),
    (b'1\n1\n0\n0\n1.0\n0\n64\n5\n1\n', 'repetition_penalty must be > 0'),
    (b'1\n1\n0\n0\n1.0\n1.0\n64\n5\n128\n', 'token id 128 is outside'),
    (b'-4\n', 'num_tokens must be'),
    (b'40\n1\n0\n0\n1\n1\n0\n0\n' + b'1\n' * 40, 'exceed the context of 32'),
    (b'1' * 5000, 'line 1 (num_tokens) is longer than 1024 bytes'),                          # no newline at all
    (b'1\n1\n0.' + b'0' * 1100 + b'\n0\n1.0\n1.0\n64\n5\n1\n', 'line 3 (temperature) is longer than 1024 bytes'),
    (b'1\n1\n0.0\n0\n1.0\n1.0\n64\n5\n' + b' ' * 1100 + b'1\n', 'line 9 (token 1 of 1) is longer than'),
])
def test_engine_rejects_malformed_requests(model, stdin, msg):
    rc, out, err = run_engine(model, stdin, in_process=True)
    assert rc == 2 and out == '' and err.count('\n') == 1 and msg in err, (rc, out, err)

def test_engine_line_cap_boundary(model):
    """A line of exactly MAX_LINE_BYTES (newline included) is still a request line; one byte more is refused."""
    from nac_lab.trillim.engine import MAX_LINE_BYTES
    assert MAX_LINE_BYTES == 1024
    line = lambda v, n: v + b' ' * (n - len(v) - 1) + b'\n'
    rc, out, err = run_engine(model, line(b'0', MAX_LINE_BYTES), in_process=True)
    assert (rc, out, err) == (0, '', '')
    rc, out, err = run_engine(model, line(b'0', MAX_LINE_BYTES + 1), in_process=True)
    assert rc == 2 and out == '' and 'line 1 (num_tokens) is longer than 1024 bytes' in err, (rc, out, err)

def test_engine_endless_line_is_refused_not_buffered(model):
    """A peer that sends 8 MB without a newline gets a one-line request error (exit 2) from the real process."""
    rc, out, err = run_engine(model, b'7' * (8 << 20))
    assert rc == 2 and out == '' and err.count('\n') == 1 and 'is longer than 1024 bytes' in err, (rc, out, err)

@pytest.mark.parametrize('stdin', [
    b'1\n1\n1e-45\n0\n1.0\n1.0\n64\n3\n5\n0\n',        # temperature so small that logits / t overflow float32
    b'1\n1\n1.0\n0\n1.0\n1e-300\n64\n3\n5\n0\n',       # repetition penalty so small that logit / p overflows
    b'1\n1\n1e-45\n1\n1e-9\n1e-300\n0\n3\n5\n0\n',
])
def test_engine_extreme_sampling_values_do_not_crash(model, stdin):
    """Legal but extreme sampling values (both > 0) used to make inf - inf = nan and crash torch.multinomial."""
    rc, out, err = run_engine(model, stdin, in_process=True)
    v = [int(x) for x in out.split()]
    assert (rc, err) == (0, '') and len(v) == 5 and v[3] == 127 and v[4] == 1 + 3 - 1, (rc, out, err)

def test_engine_rejects_foreign_lora(model, tmp_path):
    """A qmodel.lora quantized for a wider model with the same layer count must not be sliced to fit."""
    d, cfg = model
    w = tiny_checkpoint(tmp_path/'w', arch='bitnet', layers=1, vocab=128, eos=127, max_pos=32, hidden=256, inter=512)
    from nac_lab.trillim.manifest import tiny_adapter
    tiny_adapter(tmp_path/'wa', w, r=2, targets=('q_proj',))
    cw = load_hf_config(w); quantize(build_manifest(w, tmp_path/'wa', cw), cw, w)
    import shutil
    shutil.copytree(d, tmp_path/'m'); shutil.copy(w/'qmodel.lora', tmp_path/'m'/'qmodel.lora')
    rc, out, err = run_engine((tmp_path/'m', cfg), b'0\n', extra=['--lora'], in_process=True)
    assert rc == 1 and out == ''
    assert 'qmodel.lora layer 0 self_attn.q_proj: A/B are 256 in / 256 out, the padded weight is 128 in / 128 out' in err, err

@pytest.mark.parametrize('edit,msg', [
    (dict(max_position_embeddings='4k'), "max_position_embeddings must be a positive integer, got '4k'"),
    (dict(max_position_embeddings=0), 'max_position_embeddings must be a positive integer'),
    (dict(rms_norm_eps=-1e-6), 'rms_norm_eps must be a positive finite number'),
    (dict(rope_theta='1e6'), "rope_theta must be a positive finite number, got '1e6'"),
    (dict(rope_scaling='yarn'), 'rope_scaling'),
    (dict(eos_token_id=2.0), 'eos_token_id must be an integer or a list'),
    (dict(architectures=[None], model_type='x'), 'architectures must be a list of strings'),
])
def test_config_bad_values_are_config_errors(edit, msg):
    """Every value that config_args would render is checked here, so the engine never refuses a vector we made."""
    with pytest.raises(ArchConfigError, match=msg.replace('(', r'\(').replace(')', r'\)')): arch_from_hf(dict(QWEN2, **edit))

def test_config_bad_side_files(tmp_path):
    (tmp_path/'config.json').write_text(json.dumps(QWEN2))
    (tmp_path/'tokenizer.json').write_text('["not", "a", "tokenizer"]')
    with pytest.raises(ArchConfigError, match='not a tokenizer.json'): load_hf_config(tmp_path)
    (tmp_path/'tokenizer.json').write_text('{"added_tokens": 5}')
    with pytest.raises(ArchConfigError, match='not a tokenizer.json'): load_hf_config(tmp_path)
    (tmp_path/'tokenizer.json').unlink()
    (tmp_path/'generation_config.json').write_text('{"eos_token_id": "151645"}')
    with pytest.raises(ArchConfigError, match='generation_config.json: eos_token_id must be'): load_hf_config(tmp_path)

def test_engine_process_errors_are_one_line(model):
    """The same checks through a real process: exit codes and a single stderr line, no hang."""
    rc, out, err = run_engine(model, b'2\n1\n0.0\n0\n1.0\n1.0\n64\n5\n1\n')
    assert rc == 2 and out == '' and err.count('\n') == 1 and 'end of input while reading token 2 of 2' in err
    rc, out, err = run_engine(model, b'0\n', cfg_args=['2'] + config_args(model[1])[1:])
    assert rc == 1 and out == '' and err.count('\n') == 1 and 'arch_type is 2' in err

def test_engine_eof_between_requests_is_clean(model):
    assert run_engine(model, b'', in_process=True) == (0, '', '')
    rc, out, err = run_engine(model, b'1\n1\n0.0\n0\n1.0\n1.0\n64\n1\n5\n')
    assert rc == 0 and len(out.split()) == 3

@pytest.mark.parametrize('mutate,msg', [
    (lambda a: a[:-1], 'num_eos_tokens is 1 but 0 EOS ids follow'),
    (lambda a: ['2'] + a[1:], 'arch_type is 2 but the model files say 1'),
    (lambda a: a[:2] + ['256'] + a[3:], 'hidden_dim is 256'),
    (lambda a: a[:10] + ['x'] + a[11:], 'field 11 (norm_eps)'),
    (lambda a: a[:9] + ['64'] + a[10:], 'rope.cache covers 32 positions'),
])
def test_engine_rejects_bad_config(model, mutate, msg):
    rc, out, err = run_engine(model, b'0\n', cfg_args=mutate(config_args(model[1])), in_process=True)
    assert rc == 1 and out == '' and err.count('\n') == 1 and msg in err, err

def test_engine_missing_lora_file(model):
    rc, out, err = run_engine(model, b'0\n', extra=['--lora'], in_process=True)
    assert rc == 1 and 'qmodel.lora: missing' in err

def test_client_write_timeout(tmp_path):
    """An engine that stops reading stdin: the request fills the pipe, the client times out instead of blocking."""
    cfg = arch_from_hf(dict(QWEN2, vocab_size=1000, eos_token_id=[7]))
    cl = TrillimClient('/m', cfg, cmd=[sys.executable, '-c', 'import time; time.sleep(60)'], timeout=1.0)
    with pytest.raises(EngineTimeout, match='did not read the request'): cl.complete([5] * 400_000)
    assert cl.proc.poll() is not None

def test_tour(tmp_path, capsys):
    from nac_lab.trillim.cli import tour, TOUR_RANK
    tour(tmp_path)
    out = capsys.readouterr().out
    assert TOUR_RANK == 50 and 'round-trips exactly' in out and 'engine --lora' in out and 'sent only 2 new tokens' in out
    assert (tmp_path/'trillim_tiny'/'qmodel.tensors').exists()

def test_client_abandoned_generator_is_drained(tmp_path):
    """Stopping iteration early must not leave the rest of the answer in the pipe for the next request."""
    cl, log = fake_client(tmp_path, [[11, 12, 13, 8, 5], [21, 7, 8]])
    g = cl.generate([1, 2, 3])
    assert next(g) == 11                              # the caller stops here; 12, 13, 8 and kv 5 are still coming
    assert cl.complete([1, 2, 3, 11, 12, 13, 99]) == [21]   # not [12, 13]
    assert cl.sent == [13, 99] and cl.kv_position == 8 and cl.last == 'eos'
    with pytest.raises(Exception, match='superseded'): next(g)
    assert cl.close() == 0
    assert log.read_bytes().split(b'\n', 1)[1] == (b'3\n1\n0.0\n0\n1.0\n1.0\n64\n0\n1\n2\n3\n'
                                                   b'2\n0\n0.0\n0\n1.0\n1.0\n64\n0\n13\n99\n0\n')
