("Convolution bands spread over several engines (one arena per L1[e], @resource(NMU[s]) with several NMUs): programs check with 0 errors "
 "and compute the same bits as on one engine.")
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.emit import Tiling
from nac_lab.nem.timing.sim import summary
from int_reference import reference_int8      # lowering's layer walk, requantized independently of nac_lab.fxp (#28 item 7)

SHAPE = (1, 4, 24, 16)

@pytest.fixture(scope='module')
def net():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=1, padding=2, dilation=2), nn.Flatten(),
                      nn.Linear(8 * 24 * 16, 6)).eval()
    return nac_compile(m, (torch.zeros(SHAPE),))

def _pol(th, ne): return {'L3_conv2d': Tiling(th, 2, engines=ne), 'L7_conv2d': Tiling(th, 2, engines=ne)}

@pytest.mark.parametrize('device,ne', [('npm_mid', 2), ('npm_pro', 4)])
def test_int8_on_several_engines_is_bit_exact(net, device, ne):
    rng = np.random.default_rng(1)
    cal = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2)]
    x = rng.standard_normal(SHAPE).astype(np.float32)
    outs = []
    for pol in (_pol(2, ne), _pol(2, 1)):
        low = lower(net, device, mode='int8', calib=cal, tiling=pol)
        assert not low.check().errors
        raw = low.run_raw(*low.quantize_inputs(x).values())
        ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
        for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])
        outs.append((low, raw))
    (lm, rm), (l1, r1) = outs
    assert f'ARENA{ne - 1} : L1[{ne - 1}]' in lm.program and 'ARENA1' not in l1.program
    busy = {u: d['busy'] for u, d in summary(lm.simulate())['units'].items() if d['busy']}
    assert all(f'E{q}.NMU[0]' in busy for q in range(ne))                        # every engine computes bands
    assert lm.simulate().total_cycles < l1.simulate().total_cycles               # and the spread program is faster
    assert ('E0.NMU[1]' in busy) == (device == 'npm_pro')        # npm_pro has 2 NMUs per engine: an engine's two slots use both
    for k in rm: np.testing.assert_array_equal(rm[k], r1[k])

def test_float_on_four_engines(net):
    x = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    low = lower(net, 'npm_pro_x1', mode='float', example=(x,), tiling=_pol(3, 4))
    assert low.elem == 'f32' and not low.check().errors
    np.testing.assert_allclose(low.run(x)[0], net.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

def test_search_times_engine_splits(net):
    "On a 2-engine device the search also times spreading the bands; whatever it picks is the fastest it timed."
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    low = lower(net, 'npm_mid', mode='int8', calib=[x])
    for n, c in low.costs.items():
        if 'conv' not in n: continue
        assert any(len(k) == 3 and k[2] == 2 for k in c)
        assert c[low.tilings[n].key] == min(c.values())
    assert not low.check().errors

def test_linear_column_tiles_on_several_engines():
    ("1 x 256 -> 1280 -> 10: the column tiles of the first layer on 4 (2) engines, int8 bit-exact and equal to one engine, float "
     "within 1e-4.")
    from nac_lab.lower.gemm import GemmTiling
    torch.manual_seed(4)
    nm = nac_compile(nn.Sequential(nn.Linear(256, 1280), nn.ReLU(), nn.Linear(1280, 10)).eval(), (torch.zeros(1, 256),))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    outs = []
    for ne in (4, 1):
        low = lower(nm, 'npm_pro', mode='int8', calib=[x], tiling={'L3_linear': GemmTiling(1, 160, 2, engines=ne)})
        assert not low.check().errors and (f'ARENA3 : L1[3]' in low.program) == (ne == 4)
        raw = low.run_raw(*low.quantize_inputs(x).values())
        ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
        for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])
        outs.append(raw)
    for k in outs[0]: np.testing.assert_array_equal(outs[0][k], outs[1][k])
    lf = lower(nm, 'npm_pro_x1', mode='float', example=(x,), tiling={'L3_linear': GemmTiling(1, 100, 2, engines=2)})
    assert lf.elem == 'f32' and not lf.check().errors
    np.testing.assert_allclose(lf.run(x)[0], nm.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

def test_pool_bands_on_every_engine():
    ("A max pool on a 4-engine device runs in row bands spread over all engines (two slots per engine), int8 bit-exact with the "
     "integer reference.")
    torch.manual_seed(6)
    m = nac_compile(nn.Sequential(nn.Conv2d(4, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, 1)).eval(), (torch.zeros(1, 4, 48, 48),))
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 48, 48)).astype(np.float32)
    low = lower(m, 'npm_pro', mode='int8', calib=[x])
    assert not low.check().errors
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
    for o in low.graph.outputs: np.testing.assert_array_equal(np.transpose(raw[o], (0, 3, 1, 2)), ref[o])     # stored NHWC
    res = low.simulate()
    engines = {res.label(j).split('.')[0] for j in range(res.table.n) if 'max_pool2d_p' in res.table.name(j)}
    assert engines == {'E0', 'E1', 'E2', 'E3'}
    assert low.program.count('maxpool.async') == 12          # 24 output rows in bands of ceil(24 / 16) = 2 rows, about 4 per engine

@pytest.fixture(scope='module')
def deep():
    "Eight 3x3 convolutions of 128 channels on 8x8: 1.2 MB of int8 weights (4.7 MB f32), more than npm_lite's 1 MB of L2."
    torch.manual_seed(8)
    layers = [nn.Conv2d(8, 128, 3, padding=1), nn.ReLU()]
    for _ in range(7): layers += [nn.Conv2d(128, 128, 3, padding=1), nn.ReLU()]
    return nac_compile(nn.Sequential(*layers).eval(), (torch.zeros(1, 8, 8, 8),))

def test_weight_ring_streams_each_weight_once(deep):
    ("The weights stream through the ring buffer in L2: each weight byte crosses the DDR port once, a later layer's weights load "
     "while an earlier layer computes, and the program computes the integer reference's bits (f32: the interpreter's values).")
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 8, 8, 8)).astype(np.float32)
    low = lower(deep, 'npm_lite', mode='int8', calib=[x])
    assert 'buffer RING : L2' in low.program and not low.check().errors
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
    for o in low.graph.outputs: np.testing.assert_array_equal(np.transpose(raw[o], (0, 3, 1, 2)), ref[o])
    res = low.simulate()
    w = sum(a.nbytes for n, a in low.data.items() if n.endswith('_w'))
    other = sum(a.nbytes for n, a in low.data.items() if not n.endswith('_w')) + x.size     # biases (read per use) and the input
    assert w > 10 ** 6 and w <= res.table.level_bytes['DDR']['read'] <= w + 8 * other
    rows = {res.table.name(j).split('@')[0]: j for j in range(res.table.n)}
    convs = sorted({int(n.split('_')[1][1:]) for n in rows if '_conv2d_w_load' in n})
    load2 = min(res.start[j] for n, j in rows.items() if f'_L{convs[2]}_conv2d_w_load' in n)
    conv1 = min(res.start[j] for n, j in rows.items() if f'_L{convs[1]}_conv2d_conv' in n)
    assert load2 < conv1                       # the third layer's weights are on their way before the second layer computes
    lf = lower(deep, 'npm_lite', mode='float', example=(x,))
    assert 'buffer RING : L2' in lf.program and not lf.check().errors
    np.testing.assert_allclose(lf.run(x)[0], deep.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)
