"""ONNX files nac_lab did not write (issue #32 item 2): torchvision models exported by PyTorch's own dynamo ONNX exporter
(`torch.onnx.export(..., dynamo=True)`, which needs `onnxscript`), imported with `import_onnx` and run as NAC programs; the outputs
equal eager PyTorch within 1e-4 relative. One model runs in every test pass; the list runs with NAC_LAB_TEST_FLAGS=slow."""
import os, warnings
import pytest
import torch

pytest.importorskip('onnx')
pytest.importorskip('onnxscript')

from nac_lab.bench.peers import rel_err                                     # noqa: E402
from nac_lab.onnx.importer import import_onnx                               # noqa: E402

TOL = 1e-4
SIDE = 32               # small inputs: every listed model accepts 32x32 (global pooling before the classifier)
SAMPLE = ('resnet18',)
SLOW = ('resnet18', 'mobilenet_v2', 'squeezenet1_1', 'shufflenet_v2_x0_5', 'mnasnet0_5', 'mobilenet_v3_small', 'efficientnet_b0',
        'regnet_x_400mf', 'densenet121')

def tv():
    from nac_lab.bench.peers import import_torchvision
    try: return import_torchvision()
    except ImportError as ex: pytest.skip(f'torchvision: {ex}')

def dynamo_import(name):
    "`(opset, ONNX node count, rel err of the imported NAC program vs eager)` for torchvision model `name`, random weights (seed 0)."
    torch.manual_seed(0)
    m = tv().models.get_model(name, weights=None).eval()
    x = torch.randn(1, 3, SIDE, SIDE)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        om = torch.onnx.export(m, (x,), dynamo=True, verbose=False).model_proto
    nm = import_onnx(om, example=[x])
    with torch.no_grad(): want = m(x)
    got = nm.run(x)[0]
    assert got.shape == want.shape
    return om.opset_import[0].version, len(om.graph.node), rel_err(got.numpy(), want.numpy())

@pytest.mark.parametrize('name', SAMPLE)
def test_dynamo_export_imports(name):
    opset, nodes, err = dynamo_import(name)
    assert opset >= 18 and nodes > 20, (opset, nodes)
    assert err < TOL, (name, err)

@pytest.mark.slow
@pytest.mark.skipif('slow' not in os.environ.get('NAC_LAB_TEST_FLAGS', '').split(),
                    reason='the torchvision list through the dynamo exporter (~6 min): set NAC_LAB_TEST_FLAGS=slow to run it')
def test_dynamo_export_list(capsys):
    ok, bad = [], []
    for name in SLOW:
        try:
            _, nodes, err = dynamo_import(name)
            (ok if err < TOL else bad).append((name, f'{nodes} nodes, rel err {err:.1e}'))
        except Exception as ex: bad.append((name, f'{type(ex).__name__}: {str(ex).splitlines()[0][:160] if str(ex) else ""}'))
    with capsys.disabled():
        print(f'\ndynamo ONNX export -> NAC import: {len(ok)} of {len(SLOW)} torchvision models match eager within {TOL}')
        for name, why in ok + bad: print(f'  {name}: {why}')
    assert not bad, bad
