"""Cascades (`lower.cascade`): an expand 1x1 conv and the depthwise conv reading it run band by band in L1. A cascaded int8 program is
bit-exact with the independent integer reference and with the uncascaded emission, moves fewer bytes between L1 and the activations
in L2, and takes fewer simulated cycles; float programs (not cascaded) still match the NAC interpreter."""
import re
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from lower_checks import assert_int8_bit_exact

def inverted_residual(ci, co, t, s):
    "A MobileNetV2 block without its shortcut: expand 1x1 + BN + ReLU6, depthwise 3x3 (stride `s`) + BN + ReLU6, project 1x1 + BN."
    m = ci * t
    return nn.Sequential(nn.Conv2d(ci, m, 1, bias=False), nn.BatchNorm2d(m), nn.ReLU6(),
                         nn.Conv2d(m, m, 3, s, 1, groups=m, bias=False), nn.BatchNorm2d(m), nn.ReLU6(),
                         nn.Conv2d(m, co, 1, bias=False), nn.BatchNorm2d(co))

class Toy(nn.Module):
    "A stem conv and two inverted residual blocks: one with the identity shortcut, one strided."
    def __init__(s):
        super().__init__()
        s.stem = nn.Conv2d(3, 8, 3, 1, 1); s.b1 = inverted_residual(8, 8, 6, 1); s.b2 = inverted_residual(8, 16, 6, 2)
    def forward(s, x):
        x = torch.relu(s.stem(x)); x = x + s.b1(x)
        return s.b2(x)

SHAPE = (1, 3, 20, 18)

@pytest.fixture(scope='module')
def toy():
    torch.manual_seed(0); m = Toy().eval()
    for b in m.modules():                       # statistics that are not the identity, so the folded affines matter
        if isinstance(b, nn.BatchNorm2d): b.running_mean.uniform_(-.2, .2); b.running_var.uniform_(.5, 1.5)
    return nac_compile(m, (torch.zeros(SHAPE),))

@pytest.fixture(scope='module')
def cal():
    rng = np.random.default_rng(1)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3)]

def act_l2_bytes(text) -> int:
    "Bytes of every transfer or store of the program that reads or writes the activation buffer `ACT_L2`."
    return sum(int(n) for n in re.findall(r'region\(ACT_L2, [^,]+, (\d+)\)', text))

def cascades(low) -> int: return sum(1 for l in low.graph.layers if getattr(l, 'cascade', None))

@pytest.mark.parametrize('device', ['npm_pro', 'npm_mid'])
def test_cascade_bit_exact_fewer_bytes_and_cycles(toy, cal, device):
    on, off = (lower(toy, device, mode='int8', calib=cal, cascade=c) for c in (True, False))
    assert cascades(on) == 2 and cascades(off) == 0
    assert not on.check().errors and not off.check().errors
    assert_int8_bit_exact(on, SHAPE, [0, 1])
    x = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    q = on.quantize_inputs(x)
    a, b = on.run_raw(*q.values()), off.run_raw(*q.values())
    for o in a: np.testing.assert_array_equal(a[o], b[o])
    # the two expanded tensors (20*18*48 and 20*18*48 bytes) are neither stored nor loaded again: at least 2 * 2 * 17280 bytes fewer
    assert act_l2_bytes(off.program) - act_l2_bytes(on.program) >= 4 * 17280
    assert on.simulate().total_cycles < off.simulate().total_cycles

def test_float_not_cascaded_matches_interpreter(toy):
    x = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float32)
    low = lower(toy, 'npm_pro_x1', mode='f32', example=(x,))
    assert cascades(low) == 0
    np.testing.assert_allclose(low.run(x)[0], toy.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

def test_mobilenet_v2_64_cascaded_bit_exact():
    from nac_lab.bench.peers import import_torchvision
    tv = import_torchvision()
    torch.manual_seed(0)
    shape = (1, 3, 64, 64)
    m = nac_compile(tv.models.mobilenet_v2(weights=None).eval(), (torch.zeros(shape),))
    rng = np.random.default_rng(0)
    low = lower(m, 'npm_pro', mode='int8', calib=[rng.standard_normal(shape).astype(np.float32) for _ in range(2)])
    assert cascades(low) == 17                  # 16 blocks with an expand conv; the first (depthwise -> project) cascades too
    assert not low.check().errors
    assert_int8_bit_exact(low, shape, [0])

def test_cascade_with_project_bit_exact(toy, cal):
    "cascade='project': the project 1x1 conv and its shortcut add run in the cascade too; only the blocks' outputs reach L2."
    pr, on = (lower(toy, 'npm_pro', mode='int8', calib=cal, cascade=c) for c in ('project', True))
    assert [l.cascade['project'] is not None for l in pr.graph.layers if getattr(l, 'cascade', None)] == [True, True]
    assert not pr.check().errors
    assert_int8_bit_exact(pr, SHAPE, [0, 1])
    # the two depthwise results (20*18*48 and 10*9*48 bytes) are neither stored nor loaded again
    assert act_l2_bytes(on.program) - act_l2_bytes(pr.program) >= 2 * (17280 + 4320)


class Lone(nn.Module):
    "MobileNetV2's first block: a stem conv, then a depthwise 3x3 + ReLU6 and a project 1x1 with no expand conv before them."
    def __init__(s):
        super().__init__()
        s.stem = nn.Conv2d(3, 16, 3, 2, 1); s.dw = nn.Conv2d(16, 16, 3, 1, 1, groups=16); s.pr = nn.Conv2d(16, 8, 1)
    def forward(s, x): return s.pr(nn.functional.relu6(s.dw(nn.functional.relu6(s.stem(x)))))

def test_lone_depthwise_with_project(cal):
    torch.manual_seed(2)
    m = nac_compile(Lone().eval(), (torch.zeros(SHAPE),))
    on, off = (lower(m, 'npm_pro', mode='int8', calib=cal, cascade=c) for c in (True, False))
    cs = [l.cascade for l in on.graph.layers if getattr(l, 'cascade', None)]
    assert len(cs) == 1 and cs[0]['expand'] is None and cs[0]['project'] is not None
    assert not on.check().errors
    assert_int8_bit_exact(on, SHAPE, [0, 1])
    # the depthwise result (10*9*16 = 1440 bytes) is neither stored nor loaded again: without the cascade the depthwise conv stores
    # it and the project conv loads it back (each band's rows once); with it, no task of either layer touches ACT_L2 by itself
    dw, pj = cs[0]['dw'].name, cs[0]['project'].name
    mine = lambda text, name, k: sum(int(n) for n in re.findall(rf'^t\d+_{name}_{k}\d* = .*region\(ACT_L2, [^,]+, (\d+)\)', text, re.M))
    assert (mine(off.program, dw, 's'), mine(off.program, pj, 'x')) == (1440, 1440)
    assert (mine(on.program, dw, 's'), mine(on.program, pj, 'x')) == (0, 0)
    assert act_l2_bytes(on.program) < act_l2_bytes(off.program)

def test_report_of_a_cascaded_program(toy, cal):
    "The per-layer report times each layer alone: a cascaded layer is then emitted by itself (no KeyError for the cascade's input)."
    low = lower(toy, 'npm_pro', mode='int8', calib=cal)
    rows = {r['layer']: r for r in low.report()}
    for l in low.graph.layers:
        if getattr(l, 'cascade', None): assert rows[l.name]['cycles'] > 0 and rows[l.cascade['expand'].name]['cycles'] > 0

def test_report_of_a_project_cascade(toy, cal):
    "cascade='project': the report times the project conv alone too (its shortcut operand is the cascade's input: emitted by itself)."
    low = lower(toy, 'npm_pro', mode='int8', calib=cal, cascade='project')
    rows = {r['layer']: r for r in low.report()}
    casc = [l for l in low.graph.layers if getattr(l, 'cascade', None) and l.cascade['project'] is not None]
    assert casc and all(rows[l.name]['cycles'] > 0 for l in casc)

class Wide(nn.Module):
    "MnasNet's inverted residual: expand 1x1, depthwise k x k (k // 2 rows of padding), project 1x1."
    def __init__(s, k=5, stride=1):
        super().__init__()
        s.ex = nn.Conv2d(3, 24, 1); s.dw = nn.Conv2d(24, 24, k, stride, k // 2, groups=24); s.pr = nn.Conv2d(24, 8, 1)
    def forward(s, x): return s.pr(nn.functional.relu(s.dw(nn.functional.relu(s.ex(x)))))

def test_depthwise_5x5_parts_near_the_top():
    ("Bands of 2 output rows on npm_pro (8 rows over 4 engines), each split over the engine's 2 NMUs: the part holding output row 1 "
     "of the top band still needs one of the two rows of top padding (it once got none, an AssertionError in mnasnet0_5).")
    shape = (1, 3, 8, 10)
    torch.manual_seed(3)
    m = nac_compile(Wide().eval(), (torch.zeros(shape),))
    rng = np.random.default_rng(4)
    low = lower(m, 'npm_pro', mode='int8', calib=[rng.standard_normal(shape).astype(np.float32) for _ in range(2)], cascade='project')
    cs = [l.cascade for l in low.graph.layers if getattr(l, 'cascade', None)]
    assert len(cs) == 1 and cs[0]['th'] == 2 and cs[0]['project'] is not None
    assert 'pads=[1, 2, 0, 2]' in low.program                # output row 1 of the top band: one padding row, input rows 0..2
    assert not low.check().errors
    assert_int8_bit_exact(low, shape, [0, 1])

@pytest.mark.parametrize('k, stride, rows', [(3, 2, 9), (5, 2, 12), (7, 1, 8), (7, 2, 16)])
def test_depthwise_parts_bit_exact(k, stride, rows):
    "Other kernels, strides and heights whose bands are split over NMUs: every part reads its own rows and padding, int8 bit-exact."
    shape = (1, 3, rows, 6)
    torch.manual_seed(k * 10 + stride)
    m = nac_compile(Wide(k, stride).eval(), (torch.zeros(shape),))
    rng = np.random.default_rng(5)
    low = lower(m, 'npm_pro', mode='int8', calib=[rng.standard_normal(shape).astype(np.float32) for _ in range(2)], cascade='project')
    assert [l.cascade['project'] is not None for l in low.graph.layers if getattr(l, 'cascade', None)] == [True]
    assert not low.check().errors
    assert_int8_bit_exact(low, shape, [0, 1])
