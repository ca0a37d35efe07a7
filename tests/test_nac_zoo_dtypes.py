"""bfloat16 and float16 models keep their dtype through compile, save, load and run (issues 12 and 19).

A zoo model converted with `.to(dtype)` is compiled, saved, loaded back and run; its weights must be stored in
that dtype (no widening to float32), its output must have eager's dtype, and match eager within the dtype's
tolerance: the output is compared with PyTorch eager running the same module in the same dtype, and the bound is
a few units in the last place of the dtype at the output's magnitude (bf16 has 8 significant bits, fp16 11).
A mixed-precision module keeps every value's dtype.
"""
import pytest, torch
from torch.export import Dim
from nac_lab.nac.compiler.zoo import build_model, example_inputs
from nac_lab.nac.compiler.compile import compile as nac_compile, load
from nac_lab.nac.format import read_nac, DType

# relative to the largest |output|: 2^-8 (bf16) and 2^-11 (fp16) ulp at that magnitude, times a few for the
# reordered accumulations of matmul/conv kernels between eager and the interpreter (same kernels, same order here)
REL = {torch.bfloat16: 4 * 2.0 ** -8, torch.float16: 4 * 2.0 ** -11}
CODES = {torch.bfloat16: DType.BF16, torch.float16: DType.F16}


def _cast(xs, dtype):
    return tuple(x.to(dtype) if x.is_floating_point() else x for x in xs)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
@pytest.mark.parametrize('name', ['mlp', 'cnn', 'gpt2'])
def test_low_precision_zoo_model_runs_in_its_dtype(name, dtype, tmp_path):
    m = build_model(name).to(dtype)
    xs = _cast(example_inputs(name, 2), dtype)
    nm = nac_compile(m, xs, dynamic_shapes=({0: Dim.AUTO},))
    p = nm.save(tmp_path / f'{name}.nac')
    back = read_nac(p)
    floats = [t for t in back.tensors.values() if t.dtype in (DType.F32, DType.F64, DType.F16, DType.BF16)]
    assert floats and all(t.dtype == CODES[dtype] for t in floats)          # stored in the model's dtype
    loaded = load(p)
    assert all(t.dtype == dtype for t in loaded.interpreter.params.values() if t.is_floating_point())
    x = _cast(example_inputs(name, 3, seed=5), dtype)
    with torch.no_grad(): ref = m(*x)
    out = loaded.run(*x)[0]
    assert out.dtype == ref.dtype == dtype and out.shape == ref.shape
    err = float((out.float() - ref.float()).abs().max()) / max(float(ref.float().abs().max()), 1e-6)
    assert err <= REL[dtype], f'{name} {dtype}: relative error {err:.2e} > {REL[dtype]:.2e}'


class _Mixed(torch.nn.Module):
    "A float32 layer, then a bfloat16 layer, then float16 output: each value keeps its dtype."
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4).to(torch.bfloat16)
        self.register_buffer('scale', torch.full((4,), 0.5, dtype=torch.float16))

    def forward(self, x):
        h = torch.relu(self.a(x))
        y = self.b(h.to(torch.bfloat16))
        return y.to(torch.float16) * self.scale, h


def test_mixed_precision_keeps_each_dtype(tmp_path):
    torch.manual_seed(0)
    m = _Mixed()
    x = torch.randn(3, 8)
    nm = nac_compile(m, (x,))
    p = nm.save(tmp_path / 'mixed.nac')
    stored = {read_nac(p).param_names[k]: t.dtype for k, t in read_nac(p).tensors.items()}
    assert stored == {'a.weight': DType.F32, 'a.bias': DType.F32, 'b.weight': DType.BF16, 'b.bias': DType.BF16, 'scale': DType.F16}
    with torch.no_grad(): ref = m(x)
    out = load(p).run(x)
    assert [o.dtype for o in out] == [r.dtype for r in ref] == [torch.float16, torch.float32]
    torch.testing.assert_close(out[1], ref[1], rtol=0, atol=1e-6)
    torch.testing.assert_close(out[0], ref[0], rtol=0, atol=0)            # same kernels, same inputs: same bits


@pytest.mark.parametrize('quant', ['fp16', 'int8_channel', 'block_fp8'])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=['bf16', 'fp16'])
def test_quantization_leaves_half_precision_weights_alone(quant, dtype, tmp_path):
    "A quantization method applies to float32 weights; a half-precision model keeps its weights and runs (issues 12, 19)."
    m = build_model('mlp').to(dtype)
    xs = _cast(example_inputs('mlp', 2), dtype)
    p = nac_compile(m, xs, quant=quant).save(tmp_path / 'q.nac')
    back = read_nac(p)
    assert int(back.quant_method) == 0 and all(t.dtype == CODES[dtype] for t in back.tensors.values())
    with torch.no_grad(): ref = m(*xs)
    out = load(p).run(*xs)[0]
    assert out.dtype == dtype
    err = float((out.float() - ref.float()).abs().max()) / max(float(ref.float().abs().max()), 1e-6)
    assert err <= REL[dtype]
