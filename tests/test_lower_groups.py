("Grouped convolutions whose weights do not fit L1 are split by output channels (`lower.gemm.emit_conv_split`) in tiles of "
 "whole groups or equal parts of one group: each tile reads its groups' input channels. Checked with 0 `nem check` errors, int8 "
 "bit-exact against the independent integer reference, float within tolerance of eager, a tile straddling two groups refused.")
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.lower.layers import LowerError
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.emit import Tiling
from lower_checks import assert_int8_bit_exact

class Net(nn.Module):
    def __init__(self, c, groups): super().__init__(); self.c = nn.Conv2d(c, c, 3, padding=1, groups=groups)
    def forward(self, x): return torch.relu(self.c(x))

def _net(c, groups, hw, module=False):
    torch.manual_seed(0); m = Net(c, groups).eval()
    nm = nac_compile(m, (torch.zeros(1, c, hw, hw),))
    return (nm, m) if module else nm

def _cal(shape): rng = np.random.default_rng(1); return [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]

@pytest.mark.parametrize('groups,tco', [(8, 64), (8, 96), (128, 16), (1, 48), (2, 32)])   # 4, 6 groups of 16 per tile; depthwise;
                                                                                     # ungrouped; half of a group of 64 per tile
def test_forced_group_split_int8_exact(groups, tco):
    shape = (1, 128, 6, 6); net = _net(128, groups, 6)
    low = lower(net, 'npm_pro', mode='int8', calib=_cal(shape), tiling={'L3_conv2d': Tiling(3, 1, tco=tco)}, fuse=False)
    assert not low.check().errors
    convs = [ln for ln in low.program.splitlines() if 'conv2d.async' in ln]
    assert len(convs) == 2 * -(-128 // tco), len(convs)                  # 2 bands x the output-channel tiles
    assert f'groups={max(1, tco // (128 // groups)) if groups > 1 else 1}' in convs[0], convs[0]    # per tile
    assert_int8_bit_exact(low, shape, seeds=(2, 3))

def test_forced_group_split_float():
    "Float on npm_pro stores bf16 (8 significant bits) and accumulates in f32: within 1e-2 of eager's max |output|."
    shape = (1, 128, 6, 6); net, m = _net(128, 8, 6, module=True)
    low = lower(net, 'npm_pro', tiling={'L3_conv2d': Tiling(3, 1, tco=64)}, fuse=False)
    assert not low.check().errors
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    with torch.no_grad(): ref = m(torch.from_numpy(x)).numpy()
    y, = low.run(x)
    assert np.abs(y - ref).max() / np.abs(ref).max() < 1e-2

def test_tile_cutting_a_group_refused():
    net = _net(128, 8, 6)
    with pytest.raises(LowerError, match='output-channel tiles of 40 do not align to groups of 16 channels'):
        lower(net, 'npm_pro', mode='int8', calib=_cal((1, 128, 6, 6)), tiling={'L3_conv2d': Tiling(3, 1, tco=40)}, fuse=False)

def test_search_splits_a_grouped_conv_too_big_for_l1():
    "768 channels in 4 groups: 768*192*9 int8 weights (1.33 MB) exceed npm_pro's 1 MB L1; the search finds tiles of one group (332 KB)."
    shape = (1, 768, 4, 4); net = _net(768, 4, 4)
    low = lower(net, 'npm_pro', mode='int8', calib=_cal(shape))
    t = low.tilings['L3_conv2d']
    assert t.tco == 192, t                                                  # one group per tile (two slots of 2 groups: 1.33 MB)
    assert not low.check().errors
    assert_int8_bit_exact(low, shape, seeds=(5,))
