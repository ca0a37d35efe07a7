"""ONNX export of timm and transformers models (issue #32 item 1): small configurations with random weights (built by
`nac_lab.bench.peers.build`, seeded), compiled to NAC, exported with `NacGraph.to_onnx`, checked by the full ONNX checker and
run by ONNX Runtime against the NAC interpreter within 1e-5 relative."""
import pytest

onnx = pytest.importorskip('onnx')
ort = pytest.importorskip('onnxruntime')

from nac_lab.nac.compiler.compile import compile as nac_compile                      # noqa: E402
from nac_lab.nac.format.graph import NacGraph                                      # noqa: E402
from nac_lab.onnx.export import check                                       # noqa: E402
from nac_lab.bench.peers import build, rel_err                              # noqa: E402

TOL = 1e-5

def export_check(suite, name):
    "`(ONNX op types, rel err of ONNX Runtime vs the interpreter)` for peer model `name` of `suite`."
    m, ex, _, _ = build(suite, name)
    nm = nac_compile(m, ex)
    om = NacGraph.from_model(nm).to_onnx()
    check(om)
    s = ort.InferenceSession(om.SerializeToString(), providers=['CPUExecutionProvider'])
    got = s.run(None, {i.name: x.numpy() for i, x in zip(s.get_inputs(), ex)})[0]
    want = nm.run(*ex)[0].numpy()
    assert got.shape == want.shape, (got.shape, want.shape)
    return {n.op_type for n in om.graph.node}, rel_err(got, want)

@pytest.mark.parametrize('name,op', [('resnet10t', 'Conv'), ('mobilenetv3_small_050', 'HardSigmoid'), ('vit_tiny_patch16_224', 'Softmax')])
def test_timm(name, op):
    from nac_lab.bench.peers import import_torchvision
    try: import_torchvision()           # timm imports torchvision, which lives apart from site-packages (see bench.peers)
    except ImportError as ex: pytest.skip(f'torchvision: {ex}')
    pytest.importorskip('timm')
    ops, err = export_check('timm', name)
    assert op in ops, sorted(ops)
    assert err < TOL, (name, err)

@pytest.mark.parametrize('name,op', [('bert', 'Erf'), ('gpt2', 'Tanh'), ('llama', 'Sqrt')])
def test_transformers(name, op):
    pytest.importorskip('transformers')
    ops, err = export_check('transformers', name)
    assert op in ops, sorted(ops)
    assert err < TOL, (name, err)
