"""The interpreter's planned kernels (nac_lab.nac.runtime.kernels) against the reference step loop and PyTorch eager.

For every zoo model at batch 1 and 3: `run` (the generated program with the planned kernels) equals `run_loop` (each step's
own kernel) bit for bit unless the plan holds a kernel that sums or rounds differently (`rounds_differently`), and then
within 1e-6 relative (max |run - run_loop| / max |run_loop|). The models of each kind are listed, so a change of plan shows.
"""
import pytest, torch
from torch.export import Dim
from nac_lab.nac.compiler.zoo import zoo_names, build_model, example_inputs
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.nac.runtime.kernels import rounds_differently, conv2d_thnn, gelu_native
from nac_lab.nac.runtime.gru import GruKernel

# which zoo models hold a kernel that rounds differently from the step's own (the others must be bitwise equal)
ROUNDING_MODELS = {'mlp': {gelu_native}, 'vit_tiny': {gelu_native, conv2d_thnn}, 'gru': {GruKernel}}
_cache = {}

def model(name):
    if name not in _cache:
        m = build_model(name)
        _cache[name] = (m, nac_compile(m, example_inputs(name, 2), dynamic_shapes=({0: Dim.AUTO},)))
    return _cache[name]

@pytest.mark.parametrize('name', zoo_names())
@pytest.mark.parametrize('batch', [1, 3])
def test_planned_kernels_agree(name, batch):
    m, nm = model(name)
    it = nm.interpreter
    x = example_inputs(name, batch, seed=5)
    got, ref = nm.run(*x)[0], it.run_loop(*x)[0]
    planned = {k for k in it.kernel_plan.values() if k in (conv2d_thnn, gelu_native)}
    planned |= {type(k) for k in it.kernel_plan.values() if isinstance(k, GruKernel)}
    assert planned == ROUNDING_MODELS.get(name, set())
    assert rounds_differently(it.kernel_plan) == (name in ROUNDING_MODELS)
    if name in ROUNDING_MODELS: assert float((got - ref).abs().max() / ref.abs().max()) <= 1e-6
    else: assert torch.equal(got, ref)
    with torch.no_grad(): want = m(*x)
    assert float((got - want).abs().max() / want.abs().max()) <= 1e-5      # eager: the compiler's folding rounds too

def test_plan_counts():
    "The rules fire where the zoo's programs allow them (counts read off the zoo's generated sources)."
    def count(name, fn): return sum(k is fn for k in model(name)[1].interpreter.kernel_plan.values())
    assert count('resnet18', torch.relu_) == 17 and count('cnn', torch.relu_) == 2
    assert count('mobilenet', torch._C._nn.hardswish_) == 10 and count('unet', torch._C._nn.silu_) == 10
    assert count('vit_tiny', conv2d_thnn) == 1 and count('vit_tiny', gelu_native) == 2 and count('gpt2', gelu_native) == 0
    assert count('gpt2', torch.reshape) == 8
