"""ARK <-> NAC through files and the CLI: round trips on the zoo MLP and transformer blocks, the weights file
ruling, and clear refusals."""
import json
import numpy as np
import pytest
import torch, torch.nn as nn, torch.nn.functional as F
from nac_lab.cli import run_cli
from nac_lab.nac.compiler.zoo import build_model, example_inputs
from nac_lab.nac.compiler.compile import compile as nac_compile, load as nac_load
from nac_lab.ark.format import ark_text
from nac_lab.ark.check import ArkBuilder
from nac_lab.ark.nac import from_nac, to_nac, ArkNacError, WEIGHTS_KEY


class RmsSwiGlu(nn.Module):
    "Llama-style MLP block with a hand-written RMSNorm (pow, mean, rsqrt) and SiLU."
    def __init__(s, d=16, ff=32):
        super().__init__()
        s.w = nn.Parameter(torch.rand(d) + 0.5)
        s.g = nn.Linear(d, ff, bias=False); s.u = nn.Linear(d, ff, bias=False); s.o = nn.Linear(ff, d, bias=False)
    def forward(s, x):
        y = s.w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        return x + s.o(F.silu(s.g(y)) * s.u(y))


class Softmaxer(nn.Module):
    def __init__(s): super().__init__(); s.l = nn.Linear(8, 8)
    def forward(s, x): return torch.softmax(s.l(x), -1).transpose(0, 1) * 3.0 - 1.0


@pytest.mark.parametrize('name', ['mlp', 'rms_swiglu', 'softmax'])
def test_cli_round_trip(name, tmp_path):
    mod, x = {'mlp': (build_model('mlp'), example_inputs('mlp')[0]), 'rms_swiglu': (RmsSwiGlu(), torch.zeros(1, 3, 16)),
              'softmax': (Softmaxer(), torch.zeros(4, 8))}[name]
    torch.manual_seed(0)
    nac_compile(mod.eval(), (x,)).save(tmp_path / 'a.nac')
    shape = ','.join(map(str, x.shape))
    rc, out, err = run_cli('ark', 'from-nac', tmp_path / 'a.nac', '-o', tmp_path / 'm.json', '--shape', f'x={shape}'); assert rc == 0, err
    raw = (tmp_path / 'm.safetensors').read_bytes()
    meta = json.loads(json.loads(raw[8:8 + int.from_bytes(raw[:8], 'little')])['__metadata__'][WEIGHTS_KEY])
    assert set(meta) == {'inputs', 'outputs', 'params'} and list(meta['inputs']) == ['x']
    rc, out, err = run_cli('ark', 'check', tmp_path / 'm.json'); assert rc == 0, out
    rc, out, err = run_cli('ark', 'to-nac', tmp_path / 'm.json', '-o', tmp_path / 'b.nac'); assert rc == 0, err
    xi = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    a, b = nac_load(tmp_path / 'a.nac').run(xi)[0], nac_load(tmp_path / 'b.nac').run(xi)[0]
    np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-5)
    np.save(tmp_path / 'x.npy', xi.numpy())
    rc, out, err = run_cli('ark', 'run', tmp_path / 'm.json', '--input', f'x={tmp_path / "x.npy"}', '--output',
                           tmp_path / 'o.npz'); assert rc == 0, err
    got = np.load(tmp_path / 'o.npz')[f't{meta["outputs"][0]}']
    np.testing.assert_allclose(got, a.numpy(), rtol=1e-5, atol=1e-5)


def test_exact_gelu_marker_and_weights_names(tmp_path):
    nm = nac_compile(build_model('mlp').eval(), example_inputs('mlp'))
    m, w, meta = from_nac(nm.interpreter, {'x': (1, 32)})
    gelu = [o for _, _, o in m.ops() if o.type == 'Gelu']
    assert len(gelu) == 1 and gelu[0].args['Approximate'].value is False
    assert sorted(meta['params'].values()) == sorted(['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias', 'fc3.weight', 'fc3.bias'])
    shapes = {nm.nac.param_names[pid]: t.shape for pid, t in nm.nac.tensors.items()}
    for k, name in meta['params'].items(): assert w[int(k[1:])].shape == shapes[name]


def test_refusals(tmp_path):
    cnn = nac_compile(build_model('cnn').eval(), example_inputs('cnn'))
    with pytest.raises(ArkNacError, match='nac.conv2d has no ARK equivalent'): from_nac(cnn.interpreter, {'x': (1, 3, 32, 32)})
    b = ArkBuilder(); big = b.tensor((4, 4)); win = b.tensor((2, 2), strides=(4, 4), offsets=(1, 1), buffer=big.buffer); b.relu(win)
    with pytest.raises(ArkNacError, match='needs whole-buffer tensors'): to_nac(b.model(), {})
    (tmp_path / 'x.nac').write_bytes(b'not a nac')
    rc, out, err = run_cli('ark', 'from-nac', tmp_path / 'x.nac', '-o', tmp_path / 'y.json', '--shape', 'x=1')
    assert rc == 1 and err.startswith('nac-lab: error:')
    rc, out, err = run_cli('ark', 'from-nac', tmp_path / 'x.nac', '-o', tmp_path / 'y.json', '--shape', 'x=a,b')
    assert rc == 1 and 'expected NAME=D1,D2' in err


def test_to_nac_without_weights_file_uses_unproduced_tensors_as_inputs(tmp_path):
    b = ArkBuilder(); x = b.tensor((2, 3)); y = b.tensor((2, 3)); b.mul(b.add(x, y), x)
    (tmp_path / 'm.json').write_text(ark_text(b.model()))
    rc, out, err = run_cli('ark', 'to-nac', tmp_path / 'm.json', '-o', tmp_path / 'm.nac'); assert rc == 0 and 'no weights file' in out
    a, c = torch.randn(2, 3), torch.randn(2, 3)
    np.testing.assert_allclose(nac_load(tmp_path / 'm.nac').run(a, c)[0].numpy(), ((a + c) * a).numpy(), rtol=1e-6)
