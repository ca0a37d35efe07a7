"""Max and average pools larger than L1 run in row bands (issue #30 item 1: ResNet-50 at 224x224 in float): int8 bit-exact against the
independent integer reference, f32 within 1e-4 of the interpreter, on a 64 KiB-L1 variant of npm_pro_x1."""
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from lower_checks import assert_int8_bit_exact
from test_lower_tiling import small_device

class Pools(nn.Module):
    "A conv to 48 channels of 40x40 (76.8 KB int8, 307 KB f32), then a 3x3/2 max pool (pad 1), a ceil-mode 3x3/2 average pool."
    def __init__(s): super().__init__(); s.c = nn.Conv2d(3, 48, 3, padding=1); s.d = nn.Conv2d(48, 48, 1)
    def forward(s, x):
        y = torch.relu(s.c(x))
        y = nn.functional.max_pool2d(y, 3, 2, 1)                                   # 40 -> 20
        return nn.functional.avg_pool2d(s.d(y), 3, 2, 0, ceil_mode=True)          # 20 -> 10 (ceil), last window overhangs

SHAPE = (1, 3, 40, 40)

@pytest.fixture(scope='module')
def model():
    torch.manual_seed(11)
    return nac_compile(Pools().eval(), (torch.zeros(SHAPE),))

def test_pool_bands_int8_bit_exact(model, tmp_path):
    dev = small_device(tmp_path, 65536)
    cal = [np.random.default_rng(k).standard_normal(SHAPE).astype(np.float32) for k in range(2)]
    low = lower(model, dev, mode='int8', calib=cal)
    pool = next(l.name for l in low.graph.layers if l.op == 'maxpool')
    assert f'{pool}_x1 = region(' in low.program, 'the max pool is banded'
    assert not low.check().errors
    assert_int8_bit_exact(low, SHAPE, (3, 4))

def test_pool_bands_f32_matches_interpreter(model, tmp_path):
    dev = small_device(tmp_path, 262144)
    x = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    low = lower(model, dev, mode='f32', example=(x,))
    names = [l.name for l in low.graph.layers if l.op in ('maxpool', 'avgpool')]
    assert f'{names[0]}_x1 = region(' in low.program, 'the f32 max pool (307 KB in) is banded'
    assert not low.check().errors
    np.testing.assert_allclose(low.run(x)[0], model.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)
