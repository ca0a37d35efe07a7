"A small int8 CNN (3x3 stride 2 + ReLU, depthwise + ReLU, 1x1 + ReLU, flatten, linear) layer by layer on generated hardware."
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.hw.gen import HwConfig
from nac_lab.hw.model import run_model, cycle_report
from nac_lab.hw.sim import tool_available

@pytest.mark.skipif(not tool_available('icarus'), reason='Icarus Verilog (iverilog, vvp) not installed: tools/bootstrap.sh --test')
def test_small_cnn_equals_lowered_run(tmp_path):
    torch.manual_seed(0)
    S = (1, 3, 8, 8)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(),
                      nn.Conv2d(8, 6, 1), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 5)).eval()
    rng = np.random.default_rng(0)
    cal = [rng.standard_normal(S).astype(np.float32) for _ in range(2)]
    low = lower(nac_compile(m, (torch.zeros(S),)), 'npm_lite', mode='int8', calib=cal, fuse=False)   # one NEM layer per RTL layer
    low.save(tmp_path / 'low')
    x = rng.standard_normal(S).astype(np.float32)
    y, cyc = run_model(tmp_path / 'low', next(iter(low.quantize_inputs(x).values())), HwConfig(4, 4))
    (name, f), = low.io['outputs'].items()
    got = (y.reshape(-1).astype(np.float64) - f['quant']['zero_point']) * f['quant']['scale']
    np.testing.assert_array_equal(got.astype(np.float32), low.run(x)[0].reshape(-1))         # Lowered.run, bit for bit
    # by hand: 4x4 output, K=27 / 9 / 8 / 96; steps = Ho * ceil(Wo/4) * ceil(Co/4) * K, + 2
    assert [c for _, c in cyc] == [4 * 1 * 2 * 27 + 2, 4 * 1 * 2 * 9 + 2, 4 * 1 * 2 * 8 + 2, 1 * 1 * 2 * 96 + 2]
    rows = cycle_report(low, cyc, HwConfig(4, 4))
    assert all(r['nem_cycles'] > 0 and r['ratio'] == r['hw_cycles'] / r['nem_cycles'] for r in rows)

def test_cycles_match_the_calibrated_nem_simulator(tmp_path):
    "Generated-hardware cycles (a formula the simulations above confirm) vs the NEM estimate on the calibrated device: within 10 %."
    from nac_lab.hw.model import calibrated_device
    from nac_lab.hw.layer import load_layers
    from nac_lab.hw.gen import cycles
    torch.manual_seed(0)
    S = (1, 3, 8, 8)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(),
                      nn.Conv2d(8, 8, 1), nn.Flatten(), nn.Linear(8 * 4 * 4, 8)).eval()
    rng = np.random.default_rng(0)
    cfg = HwConfig(4, 4)
    low = lower(nac_compile(m, (torch.zeros(S),)), str(calibrated_device(tmp_path / 'dev', cfg)), mode='int8',
                calib=[rng.standard_normal(S).astype(np.float32)], fuse=False)
    low.save(tmp_path / 'low')
    hw = [(lay.name, cycles(lay, cfg)) for lay in load_layers(tmp_path / 'low') if not isinstance(lay, str)]
    ratio = {r['layer']: r['ratio'] for r in cycle_report(low, hw, cfg)}
    kinds = dict(L3_conv2d='conv', L7_conv2d='dw', L11_conv2d='conv', L15_linear='gemm')
    assert set(ratio) == set(kinds), ratio
    for name, k in kinds.items():                             # the depthwise layer too: NMU.pack_groups = 1, 4 channels per pass
        assert abs(ratio[name] - 1) <= 0.10, (name, k, ratio[name])
    # by hand, the depthwise layer (4x4 output, 8 channels, K=9): hw 4 * 1 * 2 * 9 + 2 = 74; NEM ceil(8/4) passes * 4 row tiles * 9 + 2
    assert dict(hw)['L7_conv2d'] == 74
