"""Writers of the IR v2 and Trillim areas never destroy data (issue #13 item 2).

* A failure in the middle of a write (a conversion error half-way through `qmodel.tensors`, or the disk
  filling up when the data is flushed) leaves every previous output byte for byte as it was, and leaves no
  temporary file behind; the error is typed and names the file being written.
* An output path that is one of the command's inputs or companion files (config, shard, index, adapter,
  manifest, kernel map, IR) is refused, and the input is untouched."""
import errno, json, os, shutil
from pathlib import Path
import pytest
import torch
from safetensors.torch import load_file, save_file
from nac_lab.binio import WriteError
from nac_lab.cli import run_cli
from nac_lab.core import data_path
import nac_lab.fileio as fileio
from nac_lab.irv2.build import build_ir, save_ir
from nac_lab.irv2.codegen import emit_file
from nac_lab.irv2.maps import copy_maps
from nac_lab.irv2.run import random_weights, save_weights
from nac_lab.trillim.config import load_hf_config
from nac_lab.trillim.manifest import tiny_checkpoint, tiny_adapter, build_manifest
import nac_lab.trillim.files as tfiles
from nac_lab.trillim.files import quantize, TrillimFileError

def snapshot(folder):
    "Every file under `folder` (hidden ones included) with its bytes."
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob('*')) if p.is_file()}

@pytest.fixture
def cwd(tmp_path):
    old = os.getcwd(); os.chdir(tmp_path)
    yield tmp_path
    os.chdir(old)

@pytest.fixture
def disk_full(monkeypatch):
    "Make the flush of every atomic write fail as a full disk would."
    def boom(fd): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(fileio.os, 'fsync', boom)

# ---------------------------------------------------------------------------------------------------------- Trillim

@pytest.fixture
def model(cwd):
    tiny_checkpoint('m', arch='bitnet', layers=2, vocab=64, max_pos=16)
    tiny_adapter('a', 'm', r=2, targets=('q_proj', 'down_proj'))
    rc, out, err = run_cli('trillim', 'quantize', 'm', '--adapter', 'a', '-o', 'q')
    assert rc == 0, err
    return cwd

def test_failed_quantize_keeps_previous_output(model, monkeypatch):
    before = snapshot('q')
    assert sorted(before) == ['qmodel.lora', 'qmodel.manifest', 'qmodel.tensors', 'rope.cache']
    calls, real = [0], tfiles.convert_entry
    def fail_at_7(*a, **k):                       # several records are already written when this one fails
        calls[0] += 1
        if calls[0] == 7: raise TrillimFileError('simulated conversion failure')
        return real(*a, **k)
    monkeypatch.setattr(tfiles, 'convert_entry', fail_at_7)
    cfg = load_hf_config('m')
    with pytest.raises(TrillimFileError, match='simulated'): quantize(build_manifest('m', 'a', cfg), cfg, 'q', manifest=b'new')
    assert calls[0] == 7 and snapshot('q') == before

def test_failed_quantize_through_the_cli(model):
    # a real mid-file failure: layer 1's down_proj (the last record) is int8 "ternary" holding a 3
    before, model_before = snapshot('q'), None
    t = load_file('m/model.safetensors')
    w = t['model.layers.1.mlp.down_proj.weight']
    t['model.layers.1.mlp.down_proj.weight'] = torch.full(w.shape, 3, dtype=torch.int8)
    save_file(t, 'm/model.safetensors')
    model_before = snapshot('m')
    rc, out, err = run_cli('trillim', 'quantize', 'm', '--adapter', 'a', '-o', 'q')
    assert rc == 1 and 'outside -1..1' in err and err.count('\n') == 1, err
    assert snapshot('q') == before and snapshot('m') == model_before
    # the same into the model folder itself (the default output): nothing appears there either
    rc, out, err = run_cli('trillim', 'quantize', 'm')
    assert rc == 1 and snapshot('m') == model_before

def test_disk_full_names_the_file(model, disk_full):
    before = snapshot('q')
    cfg = load_hf_config('m')
    with pytest.raises(WriteError, match=r'cannot write quantizer output q/qmodel.tensors: No space left on device'):
        quantize(build_manifest('m', 'a', cfg), cfg, 'q', manifest=b'x')
    assert snapshot('q') == before
    Path('old.manifest').write_bytes(b'previous')
    rc, out, err = run_cli('trillim', 'manifest', 'm', '-o', 'old.manifest')
    assert rc == 1 and 'cannot write manifest old.manifest: No space left on device' in err, err
    assert Path('old.manifest').read_bytes() == b'previous' and sorted(os.listdir('.')) == ['a', 'm', 'old.manifest', 'q']

def test_trillim_outputs_that_are_inputs_are_refused(model):
    before = snapshot('.')
    for o in ('m/config.json', 'm/model.safetensors', 'a/adapter_config.json', 'a/adapter_model.safetensors'):
        rc, out, err = run_cli('trillim', 'manifest', 'm', '--adapter', 'a', '-o', o)
        assert rc == 1 and 'is also an input of this command' in err, (o, err)
    assert snapshot('.') == before
    # a manifest read from where the quantizer would write its tensors
    shutil.copy('q/qmodel.manifest', 'q/qmodel.tensors')
    before = snapshot('.')
    rc, out, err = run_cli('trillim', 'quantize', 'm', '--manifest', 'q/qmodel.tensors', '-o', 'q')
    assert rc == 1 and 'quantizer output q/qmodel.tensors is also an input' in err, err
    # a checkpoint whose shard is named like an output, quantized into its own folder
    shutil.copytree('m', 'h')
    os.rename('h/model.safetensors', 'h/rope.cache')
    Path('h/model.safetensors.index.json').write_text(json.dumps({'weight_map': {k: 'rope.cache' for k in load_file('h/rope.cache')}}))
    hb = snapshot('h')
    rc, out, err = run_cli('trillim', 'quantize', 'h')
    assert rc == 1 and 'quantizer output h/rope.cache is also an input' in err, err
    assert snapshot('h') == hb
    shutil.rmtree('h')
    assert snapshot('.') == before
    # the usual workflow still works: a manifest file written first, then quantized in place with it
    rc, out, err = run_cli('trillim', 'manifest', 'm', '-o', 'm/qmodel.manifest')
    assert rc == 0, err
    mb = Path('m/qmodel.manifest').read_bytes()
    rc, out, err = run_cli('trillim', 'quantize', 'm', '--manifest', 'm/qmodel.manifest')
    assert rc == 0 and Path('m/qmodel.manifest').read_bytes() == mb, err

# ---------------------------------------------------------------------------------------------------------- IR v2

@pytest.fixture
def irdir(cwd):
    shutil.copy(data_path('irv2', 'configs', 'tiny-llama.json'), 'cfg.json')
    rc, out, err = run_cli('irv2', 'build', 'cfg.json', '--ctx', 16, '-o', 'ir.json')
    assert rc == 0, err
    rc, out, err = run_cli('irv2', 'emit', 'ir.json', '-o', 'model.c')
    assert rc == 0, err
    return cwd

def test_irv2_disk_full_keeps_previous_files(irdir, disk_full):
    before = snapshot('.')
    rc, out, err = run_cli('irv2', 'build', 'cfg.json', '--ctx', 8, '-o', 'ir.json')
    assert rc == 1 and 'cannot write IR ir.json: No space left on device' in err, err
    rc, out, err = run_cli('irv2', 'emit', 'ir.json', '-o', 'model.c')
    assert rc == 1 and 'cannot write C file model.c: No space left on device' in err, err
    ir = build_ir('cfg.json', ctx=16)
    Path('w.safetensors').write_bytes(b'old weights')
    with pytest.raises(WriteError, match='cannot write weights file w.safetensors'): save_weights(random_weights(ir), 'w.safetensors')
    assert snapshot('.') == {**before, 'w.safetensors': b'old weights'}

def test_irv2_failure_inside_the_generator_keeps_the_c_file(irdir, monkeypatch):
    import nac_lab.irv2.codegen as cg
    before = snapshot('.')
    monkeypatch.setattr(cg, 'emit_c', lambda *a, **k: (_ for _ in ()).throw(cg.CodegenError('simulated')))
    with pytest.raises(cg.CodegenError): emit_file('ir.json', 'model.c')
    assert snapshot('.') == before

def test_irv2_outputs_that_are_inputs_are_refused(irdir):
    copy_maps('maps')
    before = snapshot('.')
    for argv in [('irv2', 'build', 'cfg.json', '-o', 'cfg.json'),
                 ('irv2', 'build', 'cfg.json', '--maps', 'maps', '-o', 'maps/kernels/rope.json'),
                 ('irv2', 'build', 'cfg.json', '--maps', 'maps', '-o', 'maps/global_buffers.json'),
                 ('irv2', 'emit', 'ir.json', '-o', 'ir.json'),
                 ('irv2', 'emit', 'ir.json', '--maps', 'maps', '-o', 'maps/decoder_layer_plan.json')]:
        rc, out, err = run_cli(*argv)
        assert rc == 1 and 'is also an input of this command' in err, (argv, err)
    assert snapshot('.') == before
    with pytest.raises(WriteError, match='is also an input'): save_ir(build_ir('cfg.json', ctx=16), 'cfg.json', inputs=['cfg.json'])
    with pytest.raises(WriteError, match='is also an input'): save_weights({}, 'ir.json', inputs=['ir.json'])
    assert snapshot('.') == before
