"""The interpreter's planned kernels (nac_lab.nac.runtime.kernels) against the reference step loop and PyTorch eager.

For every zoo model at batch 1 and 3: `run` (the generated program with the planned kernels) equals `run_loop` (each step's
own kernel) bit for bit unless the plan holds a kernel that sums or rounds differently (`rounds_differently`), and then
within 1e-6 relative (max |run - run_loop| / max |run_loop|). One exception, checked instead of that bound: where the
compiled convolutions (nac_lab.nac.runtime.ckernels) feed GroupNorm (unet), both results differ from the float64 model by
about 1e-6 and the planned one is the closer of the two; there the test asserts exactly that. The models of each kind are
listed, so a change of plan shows.
"""
import copy
import pytest, torch
from torch.export import Dim
from nac_lab.nac.compiler.zoo import zoo_names, build_model, example_inputs
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.nac.runtime.kernels import rounds_differently, conv2d_thnn, gelu_native
from nac_lab.nac.runtime.gru import GruKernel
from nac_lab.nac.runtime import ckernels, cwrap

C = ckernels.status() == 'loaded'         # the compiled kernels are planned only where they were built
CONV, DW, POOL, RMS = cwrap.CConv2d, cwrap.CDwConv2d, cwrap.CPool, cwrap.CRmsNorm
# which zoo models hold a kernel that rounds differently from the step's own (the others must be bitwise equal)
ROUNDING_MODELS = {'mlp': {gelu_native}, 'vit_tiny': {gelu_native, CONV if C else conv2d_thnn}, 'gru': {GruKernel}}
if C: ROUNDING_MODELS.update(cnn={CONV}, resnet18={CONV, 'mean'}, mobilenet={CONV, DW, 'mean'}, unet={CONV}, llama={RMS})
TRUTH_MODELS = {'unet'} if C else set()    # compared against the float64 model (see the module docstring)
_cache = {}

def model(name):
    if name not in _cache:
        m = build_model(name)
        _cache[name] = (m, nac_compile(m, example_inputs(name, 2), dynamic_shapes=({0: Dim.AUTO},)))
    return _cache[name]

def rel(a, b): return float((a.double() - b.double()).abs().max() / b.double().abs().max())

@pytest.mark.parametrize('name', zoo_names())
@pytest.mark.parametrize('batch', [1, 3])
def test_planned_kernels_agree(name, batch):
    m, nm = model(name)
    it = nm.interpreter
    x = example_inputs(name, batch, seed=5)
    got, ref = nm.run(*x)[0], it.run_loop(*x)[0]
    planned = {k for k in it.kernel_plan.values() if k in (conv2d_thnn, gelu_native)}
    planned |= {type(k) for k in it.kernel_plan.values() if isinstance(k, (GruKernel, CONV, DW, RMS))}
    planned |= {'mean' for k in it.kernel_plan.values() if isinstance(k, POOL) and k.kind == 'mean'}     # max pooling is exact
    assert planned == ROUNDING_MODELS.get(name, set())
    assert rounds_differently(it.kernel_plan) == (name in ROUNDING_MODELS)
    if name in TRUTH_MODELS:
        with torch.no_grad(): truth = copy.deepcopy(m).double()(*[t.double() if t.is_floating_point() else t for t in x])
        assert rel(got, truth) <= rel(ref, truth) and rel(got, ref) <= 2e-6
    elif name in ROUNDING_MODELS: assert rel(got, ref) <= 1e-6
    else: assert torch.equal(got, ref)
    with torch.no_grad(): want = m(*x)
    assert rel(got, want) <= 1e-5      # eager: the compiler's folding rounds too

def test_plan_counts():
    "The rules fire where the zoo's programs allow them (counts read off the zoo's generated sources)."
    def count(name, fn): return sum(k is fn for k in model(name)[1].interpreter.kernel_plan.values())
    def ccount(name, cls): return sum(type(k) is cls for k in model(name)[1].interpreter.kernel_plan.values())
    if C:     # 9 of resnet18's 17 ReLUs read a convolution alone: the C kernel applies them, the ReLU step passes its input on
        assert count('resnet18', torch.relu_) == 8 and ccount('resnet18', CONV) == 20 and count('cnn', torch.relu_) == 0
        assert ccount('mobilenet', DW) == 4 and ccount('mobilenet', CONV) == 1 and ccount('unet', CONV) == 10
        assert ccount('vit_tiny', CONV) == 1 and count('vit_tiny', conv2d_thnn) == 0
        pools = {n: sorted(k.kind for k in model(n)[1].interpreter.kernel_plan.values() if type(k) is POOL)
                 for n in ('cnn', 'resnet18', 'mobilenet', 'unet')}
        assert pools == {'cnn': ['max', 'max'], 'resnet18': ['max', 'mean'], 'mobilenet': ['mean'] * 4, 'unet': ['max', 'max']}
        assert sum(k.act[0] for k in model('resnet18')[1].interpreter.kernel_plan.values() if type(k) is CONV) == 9
        assert ccount('llama', RMS) == 5     # 2 blocks x 2 RMSNorms + the final one, each a six-step chain
    else:
        assert count('resnet18', torch.relu_) == 17 and count('cnn', torch.relu_) == 2 and count('vit_tiny', conv2d_thnn) == 1
    assert count('mobilenet', torch._C._nn.hardswish_) == 10 and count('unet', torch._C._nn.silu_) == 10
    assert count('vit_tiny', gelu_native) == 2 and count('gpt2', gelu_native) == 0
    assert count('gpt2', torch.reshape) == 8
    assert (model('gru')[1].interpreter.kernel_plan and
            all(isinstance(k, GruKernel) and (k.c is not None) == C for k in model('gru')[1].interpreter.kernel_plan.values()))

@pytest.mark.parametrize('name', ['llama', 'mistral', 'qwen2', 'gemma'])
def test_rmsnorm_chains_in_transformers_models(name):
    "Real RMSNorm modules (transformers' own Llama, Mistral, Qwen2 and Gemma code, small random configs): every norm is planned."
    pytest.importorskip('transformers')
    from nac_lab.bench.peers import build
    m, ex, _, _ = build('transformers', name)
    nm = nac_compile(m, ex)
    it = nm.interpreter
    n_norms = sum(type(mod).__name__.endswith('RMSNorm') for mod in m.modules())
    assert n_norms == 2 * m.model.config.num_hidden_layers + 1           # two per decoder layer and the final one
    assert sum(type(k) is RMS for k in it.kernel_plan.values()) == (n_norms if C else 0)
    got, ref = nm.run(*ex)[0], it.run_loop(*ex)[0]
    with torch.no_grad(): want = m(*ex)
    assert rel(got, ref) <= 1e-6 and rel(got, want) <= 1e-5
