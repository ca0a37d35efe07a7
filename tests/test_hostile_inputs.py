"""Each hostile input of issue #13 items 3-6 (IR v2 and Trillim) as a test: a typed error (a `NacLabError`
subclass) whose message names the place, in bounded time and memory -- never a bare exception, a hang, an
allocation a header asked for, or a silently wrong result."""
import io, json, os, signal, struct
from pathlib import Path
import pytest
from safetensors.torch import load_file, save_file
from nac_lab.binio import NacLabError, FormatError
from nac_lab.cli import run_cli
from nac_lab.core import data_path
from nac_lab.trillim.config import ConfigError, arch_from_hf, load_hf_config, config_args
from nac_lab.trillim.manifest import tiny_checkpoint, tiny_adapter, build_manifest, ManifestError
from nac_lab.trillim.files import quantize, read_tensors, read_lora, TrillimFileError
from nac_lab.trillim.engine import load_model, serve, env_seed, engine_main
from nac_lab.irv2.build import build_ir, read_config, load_ir, save_ir
from nac_lab.irv2.maps import IrError, ConfigError as IrConfigError, MapError, load_maps, copy_maps

DEEP = '[' * 100_000 + ']' * 100_000
HUGE = '9' * 5000

@pytest.fixture(autouse=True)
def bounded():
    "Every test here must finish within 60 s (a hang is a failure, not a stuck run)."
    def boom(*_): raise TimeoutError('hostile-input test exceeded 60 s')
    old = signal.signal(signal.SIGALRM, boom); signal.alarm(60)
    yield
    signal.alarm(0); signal.signal(signal.SIGALRM, old)

@pytest.fixture
def cwd(tmp_path):
    old = os.getcwd(); os.chdir(tmp_path)
    yield tmp_path
    os.chdir(old)

def printable(msg: str) -> bool:
    return all(ch.isprintable() or ch == '\n' for ch in msg) and msg.count('\n') <= 1

QWEN = dict(model_type='qwen2', hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000, max_position_embeddings=64, eos_token_id=3)

# ---------------------------------------------------------------------------------------------------- Trillim files

@pytest.mark.parametrize('fname', ['config.json', 'generation_config.json', 'tokenizer.json', 'model.safetensors.index.json',
                                   'adapter_config.json'])
@pytest.mark.parametrize('payload', ['deep', 'huge int', 'nan'])
def test_trillim_json_files(cwd, fname, payload):
    tiny_checkpoint('m', layers=1, vocab=64)
    tiny_adapter('a', 'm', r=2)
    text = {'deep': DEEP, 'huge int': '{"eos_token_id": ' + HUGE + ', "weight_map": ' + HUGE + ', "r": ' + HUGE + '}',
            'nan': '{"eos_token_id": NaN, "r": NaN, "weight_map": {"x": NaN}}'}[payload]
    if fname == 'config.json' and payload != 'deep':
        text = json.dumps(json.load(open('m/config.json')))[:-1] + ', "rope_theta": ' + ('NaN' if payload == 'nan' else HUGE) + '}'
    if fname == 'model.safetensors.index.json': os.remove('m/model.safetensors')
    Path('a' if fname == 'adapter_config.json' else 'm', fname).write_text(text)
    with pytest.raises(NacLabError) as ei: build_manifest('m', 'a')
    assert isinstance(ei.value, (ConfigError, ManifestError)) and fname in str(ei.value) and printable(str(ei.value))
    rc, out, err = run_cli('trillim', 'manifest', 'm', '--adapter', 'a', '-o', 'x.manifest')
    assert rc == 1 and fname in err and not os.path.exists('x.manifest'), err

def test_trillim_strict_config_types(cwd):
    # review: the string "false" was read as true and lm_head dropped
    with pytest.raises(ConfigError, match="tie_word_embeddings must be true or false, got 'false'"):
        arch_from_hf(dict(QWEN, tie_word_embeddings='false'))
    with pytest.raises(ConfigError,
                       match='num_hidden_layers must be a positive integer, got 2.0'): arch_from_hf(dict(QWEN, num_hidden_layers=2.0))
    with pytest.raises(ConfigError, match='attention_bias must be true or false'): arch_from_hf(dict(QWEN, attention_bias='yes'))
    assert arch_from_hf(dict(QWEN, tie_word_embeddings=False)).tie_word_embeddings is False

@pytest.mark.parametrize('edit,msg', [
    (dict(num_hidden_layers=2**40), 'num_hidden_layers=1099511627776 exceeds 65534'),
    (dict(max_position_embeddings=10**9), 'max_position_embeddings=1000000000 exceeds'),
    (dict(vocab_size=2**40), 'vocab_size=1099511627776 exceeds'),
    (dict(hidden_size=2**33), 'hidden_size=8589934592 exceeds'),
])
def test_trillim_sizes_are_bounded(cwd, edit, msg):
    tiny_checkpoint('m', layers=1, vocab=64)
    cfg = json.load(open('m/config.json')); cfg.update(edit)
    Path('m/config.json').write_text(json.dumps(cfg))
    for argv in (('trillim', 'manifest', 'm', '-o', 'x'), ('trillim', 'quantize', 'm', '-o', 'q')):
        rc, out, err = run_cli(*argv)
        assert rc == 1 and msg in err, err
    assert not os.path.exists('q/qmodel.tensors')

def test_trillim_layers_checked_against_the_checkpoint(cwd):
    tiny_checkpoint('m', layers=2, vocab=64)
    cfg = json.load(open('m/config.json')); cfg['num_hidden_layers'] = 60000
    Path('m/config.json').write_text(json.dumps(cfg))
    with pytest.raises(ManifestError, match='num_hidden_layers=60000 but the checkpoint has tensors for 2 layer'): build_manifest('m')

def test_many_eos_ids_are_linear(cwd):
    # review: 100,000 EOS ids took 68 s (quadratic de-duplication); the message stays short
    c = dict(QWEN, vocab_size=1 << 20, eos_token_id=list(range(100_000)))
    with pytest.raises(ConfigError, match='100000 EOS token ids, protocol v1 allows at most 8') as ei: arch_from_hf(c)
    assert len(str(ei.value)) < 200
    assert arch_from_hf(dict(QWEN, eos_token_id=[5] * 100_000 + [3])).eos_tokens == [5, 3]

def test_fifo_shard_is_refused(cwd):
    tiny_checkpoint('m', layers=1, vocab=64)
    names = list(load_file('m/model.safetensors'))
    os.remove('m/model.safetensors'); os.mkfifo('m/model-1.safetensors')
    Path('m/model.safetensors.index.json').write_text(json.dumps({'weight_map': {n: 'model-1.safetensors' for n in names}}))
    with pytest.raises(ManifestError, match='not a regular file'): build_manifest('m')
    os.mkfifo('fifo')
    with pytest.raises(FormatError, match='not a regular file'): read_tensors('fifo')
    for argv in (('trillim', 'decode', 'fifo'), ('trillim', 'quantize', 'm', '--manifest', 'fifo', '-o', 'q')):
        rc, out, err = run_cli(*argv)
        assert rc == 1 and 'not a regular file' in err, (argv, err)

def test_control_characters_are_escaped(cwd):
    tiny_checkpoint('m', layers=1, vocab=64)
    names = list(load_file('m/model.safetensors'))
    os.remove('m/model.safetensors')
    Path('m/model.safetensors.index.json').write_text(json.dumps({'weight_map': {n: 'x\x1b[2J\ny.safetensors' for n in names}}))
    with pytest.raises(ManifestError) as ei: build_manifest('m')
    assert '\\x1b[2J\\ny.safetensors' in str(ei.value) and printable(str(ei.value))

# ---------------------------------------------------------------------------------------------------- Trillim payloads

@pytest.fixture
def qmodel(cwd):
    tiny_checkpoint('m', arch='llama', layers=1, vocab=64, max_pos=16, eos=63)
    tiny_adapter('a', 'm', r=2, targets=('q_proj',))
    cfg = load_hf_config('m')
    quantize(build_manifest('m', 'a', cfg), cfg, 'm')
    return cfg

def test_nan_in_checkpoint_is_refused_by_the_quantizer(qmodel):
    good = Path('m/model.safetensors').read_bytes()
    t = load_file('m/model.safetensors')
    t['model.layers.0.mlp.up_proj.weight'][3, 5] = float('nan')
    save_file(t, 'm/model.safetensors')
    with pytest.raises(TrillimFileError, match='up_proj.weight: holds NaN'): quantize(build_manifest('m', None, qmodel), qmodel, 'q')
    Path('m/model.safetensors').write_bytes(good)
    t = load_file('a/adapter_model.safetensors')
    k = next(iter(t)); t[k][0, 0] = float('inf'); save_file(t, 'a/adapter_model.safetensors')
    with pytest.raises(TrillimFileError, match='LoRA A or B holds NaN'): quantize(build_manifest('m', 'a', qmodel), qmodel, 'q')
    assert not os.path.exists('q/qmodel.tensors')

def test_nan_payloads_are_refused_by_the_readers(qmodel):
    blob = bytearray(Path('m/qmodel.tensors').read_bytes())
    tf = read_tensors(bytes(blob))
    # the final norm is the third record (bf16); find its payload from the record layout: header 64, records 64-aligned
    pos, i = 64, 0
    while True:
        kind, role, layer, rows, cols, pr, pc, nbytes, _ = struct.unpack_from('<BBHIIIIQI', blob, pos)
        if role == 2: break                         # FINAL_NORM
        pos = (pos + 32 + nbytes + 63) // 64 * 64
    struct.pack_into('<H', blob, pos + 32 + 2, 0x7FC0)      # a bf16 NaN as its second value
    with pytest.raises(FormatError, match='bf16 payload holds NaN or infinite values') as ei: read_tensors(bytes(blob))
    assert ei.value.offset == pos + 32 + 2
    lora = bytearray(Path('m/qmodel.lora').read_bytes())
    assert read_lora(bytes(lora)).slots[0][2] is not None
    # first slot present is q (index 2): 12 header + 16 block + 2 absent slots (4 bytes each) + 16 slot header
    at = 12 + 16 + 2 * 4 + 16
    struct.pack_into('<f', lora, at, float('nan'))
    with pytest.raises(FormatError, match='A or B holds NaN'): read_lora(bytes(lora))

def run_serve(model, cfg, text, seed=0):
    out, err = io.StringIO(), io.StringIO()
    rc = serve(model, cfg, io.StringIO(text), out, err, seed=seed)
    return rc, out.getvalue().split(), err.getvalue()

def req(tokens, temperature=0.0, max_tokens=3, reset=1):
    return f'{len(tokens)}\n{reset}\n{temperature!r}\n0\n1.0\n1.0\n0\n{max_tokens}\n' + ''.join(f'{t}\n' for t in tokens)

def test_engine_tiny_temperature_and_nan_logits(qmodel):
    cfg = qmodel
    model = load_model('m', cfg)
    rc, out, err = run_serve(model, cfg, req([1, 2, 3], temperature=1e-46) + '0\n')
    assert rc == 0 and err == '' and len(out) == 5, err        # 3 tokens, the EOS that ends max_tokens, kv_position
    greedy = run_serve(load_model('m', cfg), cfg, req([1, 2, 3]) + '0\n')[1]
    assert out == greedy                                   # a temperature that small is greedy
    # weights that overflow: NaN logits are an error, not "0 0 0"
    model = load_model('m', cfg)
    model.layers[0][next(iter(model.layers[0]))].fill_(float('inf'))
    rc, out, err = run_serve(model, cfg, req([1, 2, 3]) + '0\n')
    assert rc == 2 and out == [] and 'request 1: the model produced NaN or infinite logits' in err, (out, err)

def test_engine_context_overflow_names_the_request(qmodel):
    cfg = qmodel
    rc, out, err = run_serve(load_model('m', cfg), cfg, req([1, 2, 3], max_tokens=2) + req(list(range(20)), reset=0) + '0\n')
    assert rc == 2 and 'request 2:' in err and 'exceed the context of 16' in err, err

def test_engine_seed_from_environment(qmodel, monkeypatch):
    for bad in ('abc', '-1', str(2**64), '1e3', '\x1b[2J'):
        monkeypatch.setenv('NAC_LAB_TRILLIM_SEED', bad)
        with pytest.raises(ConfigError, match='NAC_LAB_TRILLIM_SEED must be a decimal integer'): env_seed()
        err = io.StringIO()
        rc = engine_main(['m', '--config', *config_args(qmodel)], io.BytesIO(b'0\n'), io.BytesIO(), err)
        assert rc == 1 and 'NAC_LAB_TRILLIM_SEED' in err.getvalue() and printable(err.getvalue()), err.getvalue()
    monkeypatch.setenv('NAC_LAB_TRILLIM_SEED', ' 42 ')
    assert env_seed() == 42

# ---------------------------------------------------------------------------------------------------- IR v2

@pytest.mark.parametrize('payload', ['deep', 'huge int', 'nan', 'fifo'])
def test_irv2_json_files(cwd, payload):
    text = {'deep': DEEP, 'huge int': '{"version": ' + HUGE + '}', 'nan': '{"version": 2, "x": NaN}', 'fifo': None}[payload]
    for name in ('ir.json', 'config.json'):
        if text is None: os.mkfifo(name)
        else: Path(name).write_text(text)
    for argv, err_part in [(('irv2', 'info', 'ir.json'), 'ir.json'), (('irv2', 'emit', 'ir.json', '-o', 'x.c'), 'ir.json'),
                           (('irv2', 'build', 'config.json', '-o', 'y.json'), 'config.json')]:
        rc, out, err = run_cli(*argv)
        assert rc == 1 and err_part in err and printable(err.strip()), (argv, err)
    with pytest.raises(IrError): load_ir('ir.json')
    with pytest.raises(IrConfigError): read_config('config.json')
    assert not os.path.exists('x.c') and not os.path.exists('y.json')

@pytest.mark.parametrize('payload', ['deep', 'huge int'])
def test_irv2_kernel_maps(cwd, payload):
    copy_maps('maps')
    Path('maps/kernels/rope.json').write_text(DEEP if payload == 'deep' else '{"name": "rope", "n": ' + HUGE + '}')
    with pytest.raises(MapError, match='rope.json'): load_maps('maps')
    rc, out, err = run_cli('irv2', 'build', str(data_path('irv2', 'configs', 'tiny-llama.json')), '--maps', 'maps', '-o', 'ir.json')
    assert rc == 1 and 'rope.json' in err, err

def test_irv2_layers_bounded_and_strict(cwd):
    base = json.loads(Path(data_path('irv2', 'configs', 'tiny-llama.json')).read_text())
    with pytest.raises(IrConfigError, match='num_hidden_layers=2147483647 exceeds 4096'): build_ir(dict(base, num_hidden_layers=2**31 - 1))
    with pytest.raises(IrConfigError,
                       match="tie_word_embeddings must be true or false, got 'false'"): build_ir(dict(base, tie_word_embeddings='false'))
    ir = build_ir(base, ctx=8)
    ir['config']['num_hidden_layers'] = 2**31 - 1
    Path('big.json').write_text(json.dumps(ir))
    with pytest.raises(IrError, match='exceeds 4096'): load_ir('big.json')

def test_irv2_fifo_weights(cwd):
    base = build_ir(data_path('irv2', 'configs', 'tiny-llama.json'), ctx=8)
    save_ir(base, 'ir.json'); os.mkfifo('w.safetensors')
    rc, out, err = run_cli('irv2', 'run', 'ir.json', 'w.safetensors', '--tokens', '1,2', '--steps', '1', '--cache', 'cache')
    assert rc == 1 and 'not a regular file' in err, err
