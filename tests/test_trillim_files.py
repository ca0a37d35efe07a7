"""Manifests byte for byte against an independent writer of decision Trillim 1-2; round trips; and every reader
(safetensors header, manifest, qmodel.tensors, rope.cache, qmodel.lora) rejecting corrupt input with typed errors."""
import json, math, os, random, shutil, struct
from pathlib import Path
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from nac_lab.binio import FormatError
from nac_lab.trillim.config import load_hf_config
from nac_lab.trillim.manifest import (build_manifest, write_manifest, read_manifest, read_safetensors_header, tiny_checkpoint,
                                      tiny_adapter, ManifestError)
from trillim_blobs import tiny_trillim_blobs
from nac_lab.trillim.files import quantize, read_tensors, read_rope, read_lora

# ----------------------------------------------------------------------------------------------------------------
# independent manifest writer, straight from decision Trillim 1-2 (own header parser, own order, own packing)

DT = {'F32': (0, 4), 'F16': (1, 2), 'BF16': (2, 2), 'I8': (3, 1), 'U8': (4, 1)}

def st_header(path):
    raw = Path(path).read_bytes()
    n = struct.unpack('<Q', raw[:8])[0]
    h = json.loads(raw[8:8 + n]); h.pop('__metadata__', None)
    return {k: (v['dtype'], v['shape'], 8 + n + v['data_offsets'][0], v['data_offsets'][1] - v['data_offsets'][0]) for k, v in h.items()}

def ref_manifest(model_dir, adapter_dir=None):
    cfg = json.loads(Path(model_dir, 'config.json').read_text())
    if os.path.exists(os.path.join(model_dir, 'model.safetensors')): files = ['model.safetensors']
    else: files = sorted(set(json.loads(Path(model_dir, 'model.safetensors.index.json').read_text())['weight_map'].values()))
    shards = [os.path.join(model_dir, f) for f in files]
    where = {}
    for i, s in enumerate(shards):
        for k, v in st_header(s).items(): where[k] = (i,) + v
    H, I = cfg['hidden_size'], cfg['intermediate_size']
    al = lambda n: (n + 127) // 128 * 128
    pad = lambda d: al(H) if d == H else al(I) if d == I else d
    tied = cfg['tie_word_embeddings']
    bitnet = cfg['model_type'] == 'bitnet'
    names = ['model.embed_tokens.weight'] + ([] if tied else ['lm_head.weight']) + ['model.norm.weight']
    for L in range(cfg['num_hidden_layers']):
        comps = ['input_layernorm'] + (['self_attn.attn_sub_norm'] if bitnet else []) + \
                [f'self_attn.{x}_proj' for x in 'kvqo'] + ['post_attention_layernorm', 'mlp.gate_proj', 'mlp.up_proj'] + \
                (['mlp.ffn_sub_norm'] if bitnet else []) + ['mlp.down_proj']
        for c in comps:
            for suffix in ('weight', 'bias'):
                n = f'model.layers.{L}.{c}.{suffix}'
                if n in where: names.append(n)
    out = struct.pack('<H', len(shards) + (1 if adapter_dir else 0))
    for s in shards + ([os.path.join(adapter_dir, 'adapter_model.safetensors')] if adapter_dir else []):
        out += struct.pack('<H', len(s.encode())) + s.encode()
    out += struct.pack('<I', len(names))
    for n in names:
        sh, dt, shape, off, size = where[n]
        rows = shape[0] if shape else 1
        cols = shape[1] if len(shape) > 1 else 1
        if n == 'model.embed_tokens.weight': act = 2 if tied else 0
        elif n == 'lm_head.weight': act = 2
        elif len(shape) == 2: act = 3 if dt in ('I8', 'U8') else 1
        else: act = 0
        sc = where.get(n + '_scale') if act == 3 else None
        out += struct.pack('<BBIIIIHQQBHQQ', act, DT[dt][0], rows, cols, pad(rows), pad(cols), sh, off, size,
                           1 if sc else 0, sc[0] if sc else 0, sc[3] if sc else 0, sc[4] if sc else 0)
    if adapter_dir:
        ac = json.loads(Path(adapter_dir, 'adapter_config.json').read_text())
        scale = ac['lora_alpha'] / (math.sqrt(ac['r']) if ac.get('use_rslora') else ac['r'])
        ah = st_header(os.path.join(adapter_dir, 'adapter_model.safetensors'))
        out += struct.pack('<IId', cfg['num_hidden_layers'], 7, scale)
        for L in range(cfg['num_hidden_layers']):
            for t in ['self_attn.k_proj', 'self_attn.v_proj', 'self_attn.q_proj', 'self_attn.o_proj', 'mlp.gate_proj', 'mlp.up_proj',
                      'mlp.down_proj']:
                a = ah.get(f'base_model.model.model.layers.{L}.{t}.lora_A.weight')
                b = ah.get(f'base_model.model.model.layers.{L}.{t}.lora_B.weight')
                if a is None: out += b'\x00'; continue
                out += b'\x01'
                for dt, shape, off, size in (a, b):
                    out += struct.pack('<BIIHQQ', DT[dt][0], shape[0], shape[1], len(shards), off, size)
    return out

@pytest.fixture
def cwd(tmp_path):
    old = os.getcwd(); os.chdir(tmp_path)
    yield tmp_path
    os.chdir(old)

@pytest.mark.parametrize('spec', [
    dict(arch='llama'), dict(arch='llama', tied=True, qkv_bias=True, shards=3), dict(arch='bitnet', shards=2),
    dict(arch='bitnet', tied=True, hidden=128, inter=384, dtype='f32'), dict(arch='llama', vocab=64, hidden=64),
])
@pytest.mark.parametrize('spell', ['m', './m', 'm/'])
def test_manifest_matches_independent_writer(cwd, spec, spell):
    tiny_checkpoint('m', **spec)
    tiny_adapter('a', 'm', r=3, alpha=5.0, rslora=spec['arch'] == 'bitnet', targets=('q_proj', 'o_proj', 'gate_proj'))
    for adapter in (None, 'a'):
        blob = write_manifest(build_manifest(spell, adapter))
        assert blob == ref_manifest(spell, adapter)
        assert write_manifest(read_manifest(blob)) == blob

def test_manifest_prequantized_scales(cwd):
    tiny_checkpoint('m', arch='bitnet', layers=1)
    from safetensors.torch import load_file
    t = load_file('m/model.safetensors')
    g = torch.Generator().manual_seed(5)
    for k in list(t):
        if k.startswith('model.layers.') and t[k].dim() == 2:
            t[k] = torch.randint(-1, 2, tuple(t[k].shape), dtype=torch.int8, generator=g)
            if 'k_proj' not in k: t[k + '_scale'] = torch.tensor([2.0])
    save_file(t, 'm/model.safetensors')
    m = build_manifest('m')
    blob = write_manifest(m)
    assert blob == ref_manifest('m')
    acts = [(e.action.name, e.has_scale) for e in m.entries if e.dtype.name == 'I8']
    assert acts.count(('REPACK_TERNARY', True)) == 6 and acts.count(('REPACK_TERNARY', False)) == 1
    # repacked weights keep their codes; the row scale is 1 / weight_scale
    from nac_lab.trillim.files import Role
    tf = read_tensors(quantize(m, load_hf_config('m'), 'm')['tensors'])
    assert np.array_equal(tf.get(Role.Q, 0).dequant(), t['model.layers.0.self_attn.q_proj.weight'].numpy() * np.float32(0.5))
    assert np.array_equal(tf.get(Role.K, 0).dequant(), t['model.layers.0.self_attn.k_proj.weight'].numpy().astype(np.float32))

def test_manifest_refusals(cwd):
    tiny_checkpoint('m', layers=1)
    from safetensors.torch import load_file
    t = load_file('m/model.safetensors')
    for extra, msg in [({'model.layers.0.self_attn.o_proj.bias': torch.zeros(64)}, 'o_proj.bias'),
                       ({'model.layers.0.mlp.experts': torch.zeros(2, 2, 2)}, None)]:
        shutil.rmtree('x', ignore_errors=True); shutil.copytree('m', 'x')
        save_file({**t, **extra}, 'x/model.safetensors')
        if msg:
            with pytest.raises(ManifestError, match=msg): build_manifest('x')
        else: assert build_manifest('x').unused == ['model.layers.0.mlp.experts']
    tiny_adapter('a', 'm', r=2)
    cfgj = json.loads(Path('a/adapter_config.json').read_text())
    Path('a/adapter_config.json').write_text(json.dumps({**cfgj, 'rank_pattern': {'q_proj': 8}}))
    with pytest.raises(ManifestError, match='rank_pattern'): build_manifest('m', 'a')
    Path('a/adapter_config.json').write_text(json.dumps(cfgj))
    save_file({'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight': torch.zeros(2, 64)}, 'a/adapter_model.safetensors')
    with pytest.raises(ManifestError, match='lora_A without lora_B'): build_manifest('m', 'a')
    save_file({'base_model.model.lm_head.lora_A.weight': torch.zeros(2, 64)}, 'a/adapter_model.safetensors')
    with pytest.raises(ManifestError, match='not a LoRA A/B matrix'): build_manifest('m', 'a')
    # an adapter of another model, or in int8, is refused by the writer (the reader and quantizer would refuse it later)
    pre = 'base_model.model.model.layers.0.mlp.down_proj.lora_'
    save_file({pre + 'A.weight': torch.zeros(2, 64), pre + 'B.weight': torch.zeros(64, 2)}, 'a/adapter_model.safetensors')
    with pytest.raises(ManifestError, match='lora_A 2x64 / lora_B 64x2 do not fit the 64x160 base weight'): build_manifest('m', 'a')
    save_file({pre + 'A.weight': torch.zeros(2, 160, dtype=torch.int8), pre + 'B.weight': torch.zeros(64, 2, dtype=torch.int8)},
              'a/adapter_model.safetensors')
    with pytest.raises(ManifestError, match='F32/F16/BF16 matrix, got I8'): build_manifest('m', 'a')
    save_file({pre + 'A.weight': torch.zeros(2, 160), pre + 'B.weight': torch.zeros(64, 2)}, 'a/adapter_model.safetensors')
    assert build_manifest('m', 'a').lora.targets[0][6] is not None
    Path('a/adapter_config.json').write_text('[]')
    with pytest.raises(ManifestError, match='top level must be an object'): build_manifest('m', 'a')
    os.remove('m/model.safetensors')
    Path('m/model.safetensors.index.json').write_text(json.dumps({'weight_map': {'model.norm.weight': 'lost.safetensors'}}))
    with pytest.raises(ManifestError, match='lost.safetensors: cannot open'): build_manifest('m')

# ----------------------------------------------------------------------------------------------------------------
# corrupt input: every truncation and random damage gives a FormatError (or, for damage to plain data, a clean
# parse) -- never another exception, a hang or a huge allocation

@pytest.fixture(scope='module')
def files(tmp_path_factory):
    # built from relative paths inside the temporary folder (tests/trillim_blobs.py): the same bytes whatever the path
    b = tiny_trillim_blobs(tmp_path_factory.mktemp('files'), ('q_proj', 'up_proj'))
    readers = {'manifest': read_manifest, 'tensors': read_tensors, 'rope': read_rope, 'lora': read_lora}
    return {k: (readers[k], b[k]) for k in readers}

def lora_start(blob) -> int:
    "Where the optional LoRA block of a manifest starts, from the byte layout of §6 / decision Trillim 1 (own parse)."
    ns, pos = struct.unpack_from('<H', blob, 0)[0], 2
    for _ in range(ns): pos += 2 + struct.unpack_from('<H', blob, pos)[0]
    return pos + 4 + 55 * struct.unpack_from('<I', blob, pos)[0]

def valid_prefixes(kind, blob) -> set:
    "The proper prefixes of `blob` that are themselves valid files: a manifest cut right before its LoRA block."
    return {lora_start(blob)} if kind == 'manifest' else set()

def cut_points(blob, kind) -> list:
    "Deterministic cut positions: the first 400 bytes, about 300 evenly spread ones, the last 64, and +-3 around each valid prefix."
    n = len(blob)
    cuts = set(range(min(n, 400))) | set(range(0, n, max(1, n // 300))) | set(range(max(0, n - 64), n))
    for v in valid_prefixes(kind, blob): cuts |= set(range(max(0, v - 3), min(n, v + 4)))
    return sorted(cuts)

KINDS = ['manifest', 'tensors', 'rope', 'lora']

@pytest.mark.parametrize('kind', KINDS)
def test_every_truncation_is_rejected(files, kind):
    reader, blob = files[kind]
    reader(blob)
    ok = valid_prefixes(kind, blob)
    assert all(0 < v < len(blob) for v in ok)
    for n in cut_points(blob, kind):
        if n in ok:
            got = reader(blob[:n])                 # a manifest without its LoRA block: the same shards and entries
            assert got.lora is None and write_manifest(got) == blob[:n]
            assert got.shards == reader(blob).shards and got.entries == reader(blob).entries
            continue
        with pytest.raises(FormatError): reader(blob[:n])

def test_cut_points_are_deterministic(files):
    # the same cuts on every run, and the manifest's one valid prefix is among them
    _, blob = files['manifest']
    assert cut_points(blob, 'manifest') == cut_points(bytes(blob), 'manifest')
    v = lora_start(blob)
    assert v in cut_points(blob, 'manifest') and blob[v:v + 8] == struct.pack('<II', 1, 7)
    assert read_manifest(blob).lora is not None and read_manifest(blob[:v]).lora is None

@pytest.mark.parametrize('kind', KINDS)
def test_random_damage_is_typed(files, kind):
    reader, blob = files[kind]
    rng = random.Random(kind)
    hot = min(len(blob), 128)            # headers and first records: where structure lives
    rejected = 0
    for i in range(400):
        b = bytearray(blob)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(hot) if i % 2 else rng.randrange(len(b))
            b[at] = rng.randrange(256)
        try: reader(bytes(b))
        except FormatError: rejected += 1
        except Exception as ex: raise AssertionError(f'{kind}: {type(ex).__name__}: {ex}') from ex
    assert rejected > 50

@pytest.mark.parametrize('kind', KINDS)
def test_appended_bytes_are_rejected(files, kind):
    reader, blob = files[kind]
    with pytest.raises(FormatError, match='unexpected bytes'): reader(blob + b'\x00' * 4)

@pytest.mark.parametrize('kind,off,val,msg', [
    ('tensors', 0, b'XRLM', 'magic'), ('tensors', 4, b'\x02', 'version 2'), ('tensors', 8, b'\x00', 'unknown architecture 0'),
    ('tensors', 12, b'\x01', 'reserved'), ('rope', 0, b'TRLM', 'magic'), ('rope', 4, b'\x09', 'version 9'),
    ('rope', 8, b'\x01', 'reserved'), ('lora', 0, b'TRRC', 'magic'), ('lora', 4, b'\x00', 'version 0'), ('lora', 8, b'\x05', 'reserved'),
])
def test_header_fields(files, kind, off, val, msg):
    reader, blob = files[kind]
    with pytest.raises(FormatError, match=msg): reader(blob[:off] + val + blob[off + len(val):])

def test_safetensors_header_damage(tmp_path):
    tiny_checkpoint(tmp_path/'m', layers=1, vocab=32)
    raw = (tmp_path/'m/model.safetensors').read_bytes()
    n = struct.unpack('<Q', raw[:8])[0]
    p = tmp_path/'x.safetensors'
    for cut in list(range(0, 8 + n + 1, 7)) + [len(raw) - 1]:
        p.write_bytes(raw[:cut])
        with pytest.raises(FormatError): read_safetensors_header(p)
    hdr = json.loads(raw[8:8 + n])
    k = next(x for x in hdr if x != '__metadata__')
    for change, msg in [({'dtype': 'Q4'}, 'unknown dtype'), ({'shape': [-1, 2]}, 'non-negative'), ({'shape': [3]}, 'needs'),
                        ({'data_offsets': [5]}, 'begin, end'), ({'extra': 1}, 'exactly')]:
        h = dict(hdr); h[k] = {**hdr[k], **change}
        j = json.dumps(h).encode()
        p.write_bytes(struct.pack('<Q', len(j)) + j + raw[8 + n:])
        with pytest.raises(FormatError, match=msg): read_safetensors_header(p)
