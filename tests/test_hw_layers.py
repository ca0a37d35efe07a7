("The generated layer hardware (nac_lab.hw) against `nem run` on the same lowered program and inputs, bit for bit: 3x3 conv with "
 "stride and padding (+ fused ReLU), depthwise, 1x1 and gemm under Icarus, the 3x3 under Verilator too; lint clean; cycles; a "
 "whole model chained through the host.")
import json, os
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.hw.layer import load_layers, HwError
from nac_lab.hw.gen import generate, HwConfig
from nac_lab.hw.sim import simulate, lint, tool_available

CASES = dict(conv3x3=(lambda: nn.Sequential(nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.ReLU()), (1, 4, 9, 7)),
             depthwise=(lambda: nn.Sequential(nn.Conv2d(6, 6, 3, padding=1, groups=6), nn.ReLU()), (1, 6, 5, 5)),
             conv1x1=(lambda: nn.Sequential(nn.Conv2d(6, 5, 1)), (1, 6, 3, 4)),
             gemm=(lambda: nn.Sequential(nn.Linear(12, 7)), (1, 12)))
# by hand: (Ho, ceil(Wo/4), ceil(Co/4), K) -> steps = product, cycles = steps + 2 (leave idle, last epilogue)
STEPS = dict(conv3x3=5 * 1 * 2 * 36, depthwise=5 * 2 * 2 * 9, conv1x1=3 * 1 * 2 * 6, gemm=1 * 1 * 2 * 12)

def _lowered(tmp, name, seed=0):
    mod, S = CASES[name]
    torch.manual_seed(seed)
    net = nac_compile(mod().eval(), (torch.zeros(S),))
    rng = np.random.default_rng(seed)
    low = lower(net, 'npm_lite', mode='int8', calib=[rng.standard_normal(S).astype(np.float32) for _ in range(2)], tiling=2, fuse=False)
    d = tmp / f'{name}_low'; low.save(d)
    xq = next(iter(low.quantize_inputs(rng.standard_normal(S).astype(np.float32)).values()))
    return low, d, xq, next(iter(low.run_raw(xq).values()))

def _rtl(tmp, layer, cfg):
    rd = tmp / f'{layer.name}_rtl'; rd.mkdir(exist_ok=True)
    for f, t in generate(layer, cfg).items(): (rd / f).write_text(t)
    return rd

needs_iverilog = pytest.mark.skipif(not tool_available('icarus'), reason='Icarus Verilog (iverilog, vvp) not installed: '
                                                                          'tools/bootstrap.sh --test')
needs_verilator = pytest.mark.skipif(not tool_available('verilator'), reason='Verilator not installed: tools/bootstrap.sh --test')

@needs_iverilog
@pytest.mark.parametrize('name', list(CASES))
def test_layer_bit_exact_with_nem_run_under_icarus(tmp_path, name):
    low, d, xq, ref = _lowered(tmp_path, name)
    (layer,) = load_layers(d)
    rd = _rtl(tmp_path, layer, HwConfig(4, 4))
    y, cyc, _ = simulate(rd, xq, 'icarus')
    np.testing.assert_array_equal(y.reshape(-1), ref.reshape(-1))
    assert cyc == STEPS[name] + 2 == json.loads((rd / 'manifest.json').read_text())['cycles']
    if tool_available('verilator'): assert lint(rd) == ''

@needs_verilator
def test_conv3x3_bit_exact_under_verilator(tmp_path):
    low, d, xq, ref = _lowered(tmp_path, 'conv3x3', seed=1)
    (layer,) = load_layers(d)
    assert layer.relu is not None and layer.act_min == layer.y_zero
    y, cyc, _ = simulate(_rtl(tmp_path, layer, HwConfig(2, 8)), xq, 'verilator')
    np.testing.assert_array_equal(y.reshape(-1), ref.reshape(-1))
    assert cyc == 5 * 2 * 1 * 36 + 2                     # 2 pixel tiles of 2 (Wo = 4), one tile of 8 channels

def test_missing_simulator_and_bad_names(tmp_path, monkeypatch):
    import nac_lab.hw.sim as S
    monkeypatch.setattr(S.shutil, 'which', lambda exe: None)
    with pytest.raises(S.HwSimError, match='icarus not found'): S.require('icarus')
    with pytest.raises(HwError, match='simulator must be one of'): simulate(tmp_path, np.zeros(1, np.int8), 'modelsim')
    with pytest.raises(HwError, match='no manifest.json'): S.read_manifest(tmp_path)
    (tmp_path / 'manifest.json').write_text('{"top": "evil; module", "layer": "x", "input": 1, "output": 1, "files": [], "cycles": 1}')
    with pytest.raises(HwError, match='is not hw_<layer>'): S.read_manifest(tmp_path)

@pytest.mark.slow
@pytest.mark.skipif('slow' not in os.environ.get('NAC_LAB_TEST_FLAGS', '').split(), reason='slow: set NAC_LAB_TEST_FLAGS=slow')
@needs_verilator
@pytest.mark.parametrize('name', ['depthwise', 'conv1x1', 'gemm'])
def test_other_kinds_bit_exact_under_verilator(tmp_path, name):
    "The other three kinds under Verilator too (each build takes ~10 s of CPU: NAC_LAB_TEST_FLAGS=slow)."
    low, d, xq, ref = _lowered(tmp_path, name, seed=2)
    (layer,) = load_layers(d)
    y, cyc, _ = simulate(_rtl(tmp_path, layer, HwConfig(4, 4)), xq, 'verilator')
    np.testing.assert_array_equal(y.reshape(-1), ref.reshape(-1))
    assert cyc == STEPS[name] + 2

@needs_iverilog
@pytest.mark.parametrize('name', ['conv3x3', 'depthwise'])
def test_fused_relu_bit_exact(tmp_path, name):
    "Lowered with the default fuse=True (the ReLU in the conv's epilogue, bands interleaved with it): same RTL, bit for bit."
    mod, S = CASES[name]
    torch.manual_seed(0); rng = np.random.default_rng(0)
    low = lower(nac_compile(mod().eval(), (torch.zeros(S),)), 'npm_lite', mode='int8',
                calib=[rng.standard_normal(S).astype(np.float32) for _ in range(2)], tiling=2)
    d = tmp_path / 'fused'; low.save(d)
    (layer,) = load_layers(d)
    assert layer.relu is not None and layer.act_min == layer.y_zero and len(layer.bands) > 1
    xq = next(iter(low.quantize_inputs(rng.standard_normal(S).astype(np.float32)).values()))
    ref = next(iter(low.run_raw(xq).values()))
    y, cyc, _ = simulate(_rtl(tmp_path, layer, HwConfig(4, 4)), xq, 'icarus')
    np.testing.assert_array_equal(y.reshape(-1), ref.reshape(-1))
    assert cyc == STEPS[name] + 2

def test_fused_clamp_is_refused_by_name(tmp_path):
    "A fused epilogue the RTL does not have (ReLU6: a clamp that requantizes) is refused with an error that names the fix."
    torch.manual_seed(0); rng = np.random.default_rng(0)
    S = (1, 4, 6, 6)
    low = lower(nac_compile(nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU6()).eval(), (torch.zeros(S),)), 'npm_lite',
                mode='int8', calib=[rng.standard_normal(S).astype(np.float32) for _ in range(2)], tiling=2)
    d = tmp_path / 'fused'; low.save(d)
    with pytest.raises(HwError, match='clamp step.*fuse=False'): load_layers(d)
