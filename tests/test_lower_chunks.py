("Weight transfers in concurrent parts (`lower.emit.chunks`): a streamed and a resident conv check with 0 errors, execute bit-exactly "
 "against the independent integer reference, and simulate in fewer cycles than with one transfer per weight tile.")
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.emit import Tiling
from lower_checks import assert_int8_bit_exact

SHAPE = (1, 256, 6, 6)

class Net(nn.Module):
    def __init__(self): super().__init__(); self.c = nn.Conv2d(256, 256, 3, padding=1)
    def forward(self, x): return torch.relu(self.c(x))

@pytest.fixture(scope='module')
def net():
    torch.manual_seed(0)        # 3x3x256x256 int8 weights: 589824 bytes
    return nac_compile(Net().eval(), (torch.zeros(SHAPE),))

def _to_l1(low):
    return [ln for ln in low.program.splitlines() if '= transfer.async(' in ln      # by token name: the source may be the constant pack
            and '_L3_conv2d_w' in ln.split(' = ')[0] and '_load' not in ln.split(' = ')[0]]

def _cal(): rng = np.random.default_rng(1); return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2)]

@pytest.mark.parametrize('tiling,parts', [(Tiling(6, 1, tco=64), 2),     # streamed tiles of 3*3*256*64 = 147456 bytes: 2 parts
                                          (Tiling(6, 1), 4)])             # resident 589824 bytes: 9 x 64 KiB, at most 4 parts
def test_weight_parts_exact_and_faster(net, tiling, parts, monkeypatch):
    low = lower(net, 'npm_pro', mode='int8', calib=_cal(), tiling={'L3_conv2d': tiling}, fuse=False)
    assert not low.check().errors
    w = _to_l1(low)                # the weight transfers into L1 (from L2 or DDR)
    assert len(w) >= parts, w[:4]
    assert_int8_bit_exact(low, SHAPE, seeds=(2,))
    fast = low.simulate().total_cycles
    import nac_lab.lower.emit as em, nac_lab.lower.gemm as gm
    one = lambda n, parts=4, least=65536: [(0, n)]
    monkeypatch.setattr(em, 'chunks', one); monkeypatch.setattr(gm, 'chunks', one)
    slow = lower(net, 'npm_pro', mode='int8', calib=_cal(), tiling={'L3_conv2d': tiling}, fuse=False)
    assert len(_to_l1(slow)) * parts == len(w)
    assert fast < slow.simulate().total_cycles

def test_timing_probe_without_channel_scales(net, monkeypatch):
    "The tile search's one-layer programs carry one per-tensor weight scale, not 256 per-channel ones, and time the same."
    import re
    import nac_lab.lower.tile as tl
    low = lower(net, 'npm_pro', mode='int8', calib=_cal(), tiling={'L3_conv2d': Tiling(6, 1, tco=64)}, fuse=False)
    l = low.graph.layer('L3_conv2d'); t = low.tilings['L3_conv2d']
    short = tl.layer_program(l, low.graph, low.device, 'i8', low.qp, t)
    monkeypatch.setattr(tl, '_PER_CHANNEL', re.compile('(?!)'))
    full = tl.layer_program(l, low.graph, low.device, 'i8', low.qp, t)
    assert 'per_channel' in full and 'per_channel' not in short and len(short) < len(full)
    assert tl.simulate_text(short, low.device).total_cycles == tl.simulate_text(full, low.device).total_cycles
