("Linear layers whose weights exceed L1: streamed in column tiles and row blocks, int8 bit-exact against the whole-tensor integer "
 "reference for every tiling, float within 1e-4 of the NAC interpreter.")
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.layers import LowerError
from nac_lab.lower.gemm import GemmTiling
from int_reference import reference_int8      # lowering's layer walk, requantized independently of nac_lab.fxp (#28 item 7)

def _mlp(k, n, out=10, rows=3, seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(k, n), nn.ReLU(), nn.Linear(n, out)).eval()
    return m, nac_compile(m, (torch.zeros(rows, k),))

@pytest.fixture(scope='module')
def big():
    "3 x 256 -> 2560 -> 10: the first weight is 640 KiB in int8, more than npm_lite's 512 KiB of L1."
    return _mlp(256, 2560)

def _run_exact(low, x):
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
    for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])
    return raw

def test_int8_tiles_are_bit_exact_and_change_no_bit(big):
    m, nm = big
    rng = np.random.default_rng(1)
    cal = [rng.standard_normal((3, 256)).astype(np.float32) for _ in range(3)]
    x = rng.standard_normal((3, 256)).astype(np.float32)
    first = 'L3_linear'
    outs, lows = [], []
    # naive, the search, and fixed tilings: ragged column tiles (96 does not divide 2560), row blocks of 2 + 1, one row, one and two slots
    for pol in ('naive', 'search', {first: GemmTiling(3, 96, 2)}, {first: GemmTiling(2, 640, 2)}, {first: GemmTiling(1, 1280, 1)}):
        low = lower(nm, 'npm_lite', mode='int8', calib=cal, tiling=pol)
        t = low.tilings[first]
        assert 256 * 2560 > low.device.l1 and t.tn < 2560 and not low.check().errors
        outs.append(_run_exact(low, x)); lows.append(low)
    for o in outs[1:]:
        for k in o: np.testing.assert_array_equal(o[k], outs[0][k])
    srch = lows[1]
    # the search is never worse than naive on the layer it tiles (both timed alone in the simulator)
    cs = srch.costs[first]
    assert cs[srch.tilings[first].key] <= cs[srch.naive[first].key]

def test_float_tiles_match_the_interpreter():
    "256 -> 1280 in f32 is 1.25 MiB of weights, more than npm_pro_x1's 1 MiB of L1."
    m, nm = _mlp(256, 1280, rows=2, seed=2)
    x = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32)
    for pol in ('search', {'L3_linear': GemmTiling(1, 200, 2)}):
        low = lower(nm, 'npm_pro_x1', mode='float', example=(x,), tiling=pol)
        assert low.elem == 'f32' and low.tilings['L3_linear'].tn < 1280 and not low.check().errors
        np.testing.assert_allclose(low.run(x)[0], nm.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

def test_a_k_too_long_for_l1_is_refused():
    "No column tile of 16 channels with the whole K fits: the error names the layer and why K is not split."
    torch.manual_seed(0)
    nm = nac_compile(nn.Sequential(nn.Linear(40000, 16)).eval(), (torch.zeros(1, 40000),))
    x = np.zeros((1, 40000), np.float32)
    with pytest.raises(LowerError, match=r'L\d+_linear .*splitting K would need i32 partial sums'):
        lower(nm, 'npm_lite', mode='int8', calib=[x])

def test_two_streamed_layers_fit_l2():
    ("256 -> 2048 -> 384: 512 KiB + 768 KiB of int8 weights. Copied to L2 they would overflow npm_lite's 1 MiB; streamed from DDR the "
     "program checks and stays bit-exact.")
    m, nm = _mlp(256, 2048, out=384, rows=1, seed=5)
    rng = np.random.default_rng(6)
    low = lower(nm, 'npm_lite', mode='int8', calib=[rng.standard_normal((1, 256)).astype(np.float32)], tiling='naive')
    assert all(t.tn < n for t, n in zip(low.tilings.values(), (2048, 384))) and not low.check().errors
    assert 'L3_linear_w_L2' not in low.program          # the first layer streams its weights; the second's 768 KiB alone fit L2 (a copy)
    _run_exact(low, rng.standard_normal((1, 256)).astype(np.float32))
