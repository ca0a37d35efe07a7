"""Fused epilogues (`lower.fuse`): a conv's ReLU / ReLU6 / residual add run on its band in L1. Fused int8 programs are bit-exact with
the integer reference, fused float programs match the NAC interpreter, and fusion removes L2 round trips and simulated cycles."""
import re
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from int_reference import reference_int8

class Block(nn.Module):
    "A ResNet BasicBlock pair: stem conv + ReLU, a block with an identity shortcut, a strided block with a 1x1 downsample, ReLU6."
    def __init__(s):
        super().__init__()
        s.stem = nn.Conv2d(3, 8, 3, 1, 1)
        s.a1, s.a2 = nn.Conv2d(8, 8, 3, 1, 1), nn.Conv2d(8, 8, 3, 1, 1)
        s.b1, s.b2, s.down = nn.Conv2d(8, 16, 3, 2, 1), nn.Conv2d(16, 16, 3, 1, 1), nn.Conv2d(8, 16, 1, 2)
        s.c = nn.Conv2d(16, 16, 1); s.fc = nn.Linear(16, 4)
    def forward(s, x):
        x = torch.relu(s.stem(x))
        x = torch.relu(s.a2(torch.relu(s.a1(x))) + x)
        x = torch.relu(s.b2(torch.relu(s.b1(x))) + s.down(x))
        x = nn.functional.relu6(s.c(x))
        return s.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))

SHAPE = (1, 3, 12, 10)

@pytest.fixture(scope='module')
def block():
    torch.manual_seed(0)
    return nac_compile(Block().eval(), (torch.zeros(SHAPE),))

@pytest.fixture(scope='module')
def cal():
    rng = np.random.default_rng(1)
    return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3)]

def l2_round_trips(text) -> int:
    "Moves between L1 and the activation buffer in L2 (`ACT_L2`): loads into L1 plus stores back."
    return len(re.findall(r'transfer\.async\(dst=region\(ARENA\d*, [^)]*\), src=region\(ACT_L2', text)) + \
        len(re.findall(r'store\.async\(dst=region\(ACT_L2', text))

def test_plan(block, cal):
    "Which layers each conv absorbs: the ReLUs, both residual adds (the second into the downsample conv), the ReLU6 (a clamp)."
    low = lower(block, 'npm_pro', mode='int8', calib=cal)
    epi = {l.name: [e['op'] for e in l.epi] for l in low.graph.layers if getattr(l, 'epi', None)}
    assert sorted(epi.values()) == sorted([['relu'], ['relu'], ['add', 'relu'], ['relu'], ['add', 'relu'], ['clamp']]), epi
    assert len(epi) == 6

@pytest.mark.parametrize('device,tiling', [('npm_pro', 'search'), ('npm_lite', 'naive'), ('npm_mid', 2)])
def test_int8_bit_exact(block, cal, device, tiling):
    low = lower(block, device, mode='int8', calib=cal, tiling=tiling)
    assert not low.check().errors
    rng = np.random.default_rng(2)
    for _ in range(2):
        x = rng.standard_normal(SHAPE).astype(np.float32)
        raw = low.run_raw(*low.quantize_inputs(x).values())
        ref = reference_int8(low.graph, low.qp, low.ql, low.qp['x'].quantize(x))
        for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])

def test_fused_equals_unfused_int8(block, cal):
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    a = lower(block, 'npm_pro', mode='int8', calib=cal, tiling=3)
    b = lower(block, 'npm_pro', mode='int8', calib=cal, tiling=3, fuse=False)
    ra, rb = a.run_raw(*a.quantize_inputs(x).values()), b.run_raw(*b.quantize_inputs(x).values())
    for k in ra: np.testing.assert_array_equal(ra[k], rb[k])

def test_float_matches_interpreter(block):
    x = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float32)
    low = lower(block, 'npm_pro_x1', mode='f32', example=(x,), tiling=3)
    assert not low.check().errors and any(getattr(l, 'epi', None) for l in low.graph.layers)
    np.testing.assert_allclose(low.run(x)[0], block.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

def test_fewer_round_trips_and_cycles(block, cal):
    "Fusion removes every ReLU's and add's load and store of whole tensors and simulates faster, same tiling."
    a = lower(block, 'npm_pro', mode='int8', calib=cal, tiling=3)
    b = lower(block, 'npm_pro', mode='int8', calib=cal, tiling=3, fuse=False)
    assert l2_round_trips(a.program) < l2_round_trips(b.program)
    assert not re.search(r'= relu\.async in \w+_in0 ', a.program) and re.search(r'= relu\.async in \w+_in0 ', b.program)
    assert a.simulate().total_cycles < b.simulate().total_cycles
