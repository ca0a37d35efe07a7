"""Norms and softmaxes larger than L1 (issue #30, Swin's 3136 tokens): the int8 f16 island is split into row blocks, and a linear
whose M/4 row block does not fit tries more row blocks; bit-exact in int8 against the independent integer reference on a small L1."""
import re
import numpy as np, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.gemm import gemm_candidates
from int_reference import reference_int8
from test_lower_tiling import small_device

class NormLin(nn.Module):
    "Swin's pattern at small size: layer_norm, a linear, a softmax over the last axis."
    def __init__(s, d=16, n=24):
        super().__init__(); s.ln, s.fc = nn.LayerNorm(d), nn.Linear(d, n)
    def forward(s, x): return torch.softmax(s.fc(s.ln(x)), -1)

def test_row_blocks_beyond_four():
    # f32, M=200, K=16, N=24: 50 rows (M/4) need x 3200 + w 1536 + y 4800 + c 4800 + b 4800 bytes (64-aligned) = 19136 > 16384;
    # 16 blocks of 13 rows fit: 832 + 1536 + 1280 + 1280 + 1280 = 6208 (each region rounded up to 64)
    c = gemm_candidates(200, 16, 24, 'f32', 16384)
    assert c and max(t.tm for t in c) < 50 and len({t.tm for t in c}) == 4

def test_int8_island_row_blocks_bit_exact(tmp_path):
    dev = small_device(tmp_path, 16384)
    torch.manual_seed(0)
    m = nac_compile(NormLin().eval(), (torch.zeros(1, 200, 16),))
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 200, 16)).astype(np.float32) for _ in range(3)]
    low = lower(m, dev, mode='int8', calib=xs)
    assert not low.check().errors
    txt = low.program
    # the layer_norm island: 200 x 16 int8 is 3200 bytes in and out, 6400 each in f16: 19200 > 16384, so row blocks
    assert 'layernorm.async in' in txt and '_xi1 = ' in txt
    x = xs[0]
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
    for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])

def test_f32_norm_and_softmax_row_blocks(tmp_path):
    # npm_pro_x1 with f32 norm/softmax variants and a 16 KiB L1: the f32 layer_norm of 200 x 16 needs 12800 + 12800 bytes whole
    from f32_device import f32_device
    d = small_device(tmp_path, 16384)
    dev = f32_device(tmp_path, ('norm<f32>.default', 'softmax<f32>.default', 'gemm.float<f32>.no_bias'))
    text = dev.read_text().replace('extends npm_pro_x1', 'extends npm_small').replace('include "npm_pro_x1.nem"', f'include "{d.name}"')
    dev.write_text(text)
    torch.manual_seed(0)
    m = nac_compile(NormLin().eval(), (torch.zeros(1, 200, 16),))
    x = np.random.default_rng(1).standard_normal((1, 200, 16)).astype(np.float32)
    low = lower(m, dev, mode='f32', example=(x,))
    assert not low.check().errors
    assert re.search(r'L\d+_layer_norm_x1 = ', low.program) and re.search(r'L\d+_softmax_x1 = ', low.program)
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)
