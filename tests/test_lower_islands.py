"""Norms and softmaxes larger than L1 (issue #30, Swin's 3136 tokens): the int8 f16 island is split into row blocks, and a linear
whose M/4 row block does not fit tries more row blocks; bit-exact in int8 against the independent integer reference on a small L1."""
import re
import numpy as np, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.gemm import gemm_candidates
from int_reference import reference_int8
from test_lower_tiling import small_device

def assert_bit_exact(low, x):
    "Every output of `low` on input `x` equals `reference_int8` bit for bit (outputs compared as stored)."
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
    for o in low.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])


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
    assert_bit_exact(low, xs[0])

def small_f32(tmp_path, l1):
    "npm_pro_x1 with f32 norm/softmax/gemm variants and an L1 of `l1` bytes."
    from f32_device import f32_device
    d = small_device(tmp_path, l1)
    dev = f32_device(tmp_path, ('norm<f32>.default', 'softmax<f32>.default', 'gemm.float<f32>.no_bias', 'view<f32>.default'))
    text = dev.read_text().replace('extends npm_pro_x1', 'extends npm_small').replace('include "npm_pro_x1.nem"', f'include "{d.name}"')
    dev.write_text(text)
    return dev

def test_f32_norm_and_softmax_row_blocks(tmp_path):
    # npm_pro_x1 with f32 norm/softmax variants and a 16 KiB L1: the f32 layer_norm of 200 x 16 needs 12800 + 12800 bytes whole
    dev = small_f32(tmp_path, 16384)
    torch.manual_seed(0)
    m = nac_compile(NormLin().eval(), (torch.zeros(1, 200, 16),))
    x = np.random.default_rng(1).standard_normal((1, 200, 16)).astype(np.float32)
    low = lower(m, dev, mode='f32', example=(x,))
    assert not low.check().errors
    assert re.search(r'L\d+_layer_norm_x1 = ', low.program) and re.search(r'L\d+_softmax_x1 = ', low.program)
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

class PatchPermute(nn.Module):
    "Swin's patch embedding: conv, permute(0, 2, 3, 1) to channels last, layer_norm; then a window transpose of rows."
    def __init__(s):
        super().__init__(); s.c, s.ln = nn.Conv2d(3, 16, 2, stride=2), nn.LayerNorm(16)
    def forward(s, x):
        y = s.ln(s.c(x).permute(0, 2, 3, 1))                                   # [1, 12, 12, 16]
        return y.reshape(1, 3, 4, 12, 16).permute(0, 1, 3, 2, 4).reshape(1, 144, 16)

def test_transpose_blocks_rule():
    from nac_lab.lower.ops import transpose_blocks
    # [1, 3, 4, 12, 16] moved as (0, 1, 3, 2, 4): size-1 axis dropped, axis 0 (3 rows) stays first; a row is 4*12*16 = 768 i8 bytes,
    # two sets of in + out: 2 * 2 * 768 = 3072 <= 4096 (one row per block), 2 * 2 * 2304 = 9216 <= 16384 (all three)
    assert transpose_blocks([1, 3, 4, 12, 16], [0, 1, 3, 2, 4], 1, 4096) == (3, 1, 2, [3, 4, 12, 16], [0, 2, 1, 3], 1)
    assert transpose_blocks([1, 3, 4, 12, 16], [0, 1, 3, 2, 4], 1, 16384)[1] == 3
    # Swin's qkv split [1, 3136, 3, 96] -> [1, 3, 3136, 96] in i8: rows of 288 bytes, 1 MiB / 4 = 262144 -> 910 rows, 3 pieces
    assert transpose_blocks([1, 3136, 3, 96], [0, 2, 1, 3], 1, 1 << 20) == (3136, 910, 2, [3136, 3, 96], [1, 0, 2], 3)
    assert transpose_blocks([4, 40], [1, 0], 1, 1 << 20) is None                          # 40 output pieces per block
    assert transpose_blocks([4, 12], [1, 0], 1, 64) is None                              # one row does not fit twice

class QKV(nn.Module):
    "A [1, 40, 3, 8] split moved to [1, 3, 40, 8] (the qkv permute): the first axis moves, 3 pieces per block."
    def forward(s, x): return (x.reshape(1, 40, 3, 8).permute(0, 2, 1, 3) * 1.5).reshape(1, 120, 8)

def test_moving_the_first_axis_stores_pieces(tmp_path):
    dev = small_device(tmp_path, 1024)        # 960 i8 bytes in and out: 1920 > 1024; rows of 24 bytes, 2 sets: 10 rows per block
    m = nac_compile(nn.Sequential(nn.Linear(24, 24), QKV()).eval(), (torch.zeros(1, 40, 24),))
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((1, 40, 24)).astype(np.float32) for _ in range(3)]
    low = lower(m, dev, mode='int8', calib=xs)
    assert not low.check().errors and re.search(r'_s3_2 = store', low.program)
    assert_bit_exact(low, xs[0])

def test_nhwc_permute_is_a_view_and_transposes_split(tmp_path):
    from nac_lab.lower.graph import import_nac
    torch.manual_seed(0)
    m = nac_compile(PatchPermute().eval(), (torch.zeros(1, 3, 24, 24),))
    g = import_nac(m, np.zeros((1, 3, 24, 24), np.float32))
    assert [l.attrs.get('view', False) for l in g.layers if l.op == 'transpose'] == [True, False]
    assert 'relayout' not in [l.op for l in g.layers]
    dev = small_device(tmp_path, 2048)        # the window transpose: 2304 i8 bytes in and out > 2048: blocks of one row
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, 3, 24, 24)).astype(np.float32) for _ in range(3)]
    low = lower(m, dev, mode='int8', calib=xs)
    assert not low.check().errors and re.search(r'L\d+_\w*permute\w*_x2 = ', low.program)
    assert_bit_exact(low, xs[0])

class Unbind(nn.Module):
    "q, k, v = a [1, 40, 3, 8] split unbound along axis 2 after a permute: slices of [3, 1, 40, 8] along its first axis."
    def forward(s, x):
        q, k, v = x.reshape(1, 40, 3, 8).permute(2, 0, 1, 3).unbind(0)
        return q * 2.0 + k - v

def test_slice_pieces_rule():
    from nac_lab.lower.attn import slice_pieces
    # [3, 40, 8] i8, keep [1, 2) of axis 0: one run of 320 bytes at 320; pieces of at most 256 // 2 // 64 * 64 = 128 bytes
    assert slice_pieces((3, 40, 8), 0, 1, 2, 1, 256) == [(320, 0, 128), (448, 128, 128), (576, 256, 64)]
    # axis 1 of [2, 5, 4] f32, keep [1, 3): runs of 2 * 4 * 4 = 32 bytes at (o * 5 + 1) * 16
    assert slice_pieces((2, 5, 4), 1, 1, 3, 4, 1024) == [(16, 0, 32), (96, 32, 32)]

def test_large_slices_copy_through_l1(tmp_path):
    dev = small_device(tmp_path, 1024)       # each slice: 960 + 320 i8 bytes > 1024: copied through L1 (one piece of 320 bytes)
    m = nac_compile(nn.Sequential(nn.Linear(24, 24), Unbind()).eval(), (torch.zeros(1, 40, 24),))
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((1, 40, 24)).astype(np.float32) for _ in range(3)]
    low = lower(m, dev, mode='int8', calib=xs)
    assert not low.check().errors and re.search(r'getitem\w*_in0 = transfer', low.program)
    assert_bit_exact(low, xs[0])

class Scores(nn.Module):
    "Window attention scores: [4, 10, 24] @ its transpose, batched over the 4 windows."
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(24, 24)
    def forward(s, x):
        y = s.fc(x).reshape(4, 10, 24)
        return y @ y.transpose(1, 2)

def test_batched_matmul_blocks(tmp_path):
    from nac_lab.lower.ops import matmul_blocks
    from nac_lab.lower.nemtext import Val
    a, b, y = Val('a', (4, 10, 24), 'i8'), Val('b', (4, 24, 10), 'i8'), Val('y', (4, 10, 10), 'i8')
    # one item: 240 + 240 + 100 bytes, each region rounded to 64: 256 + 256 + 128 = 640; two sets need 1280
    assert matmul_blocks(a, b, y, 1024) == (4, 1, 1) and matmul_blocks(a, b, y, 1280) == (4, 1, 2)
    assert matmul_blocks(a, b, y, 2600) == (4, 2, 2) and matmul_blocks(a, b, y, 600) is None
    dev = small_device(tmp_path, 1024)       # 960 + 960 + 400 bytes whole > 1024: blocks of one window
    m = nac_compile(Scores().eval(), (torch.zeros(1, 40, 24),))
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, 40, 24)).astype(np.float32) for _ in range(3)]
    low = lower(m, dev, mode='int8', calib=xs)
    assert not low.check().errors and re.search(r'matmul\w*_s3 = store', low.program)
    assert_bit_exact(low, xs[0])

def test_f32_roll_concat_pieces(tmp_path):
    from nac_lab.lower.ops import concat_pieces
    # [2, 5, 4] f32 and [2, 3, 4] along axis 1 into [2, 8, 4]: runs of 80 and 48 bytes, rows of 128 bytes in the output
    assert concat_pieces([(2, 5, 4), (2, 3, 4)], 1, 4, 1024) == [(0, 0, 0, 80), (0, 80, 128, 80), (1, 0, 80, 48), (1, 48, 208, 48)]
    dev = small_f32(tmp_path, 4096)     # the roll's concat of [1, 40, 24] f32: 3840 bytes in, 3840 out > 4096: copied in pieces
    torch.manual_seed(0)
    m = nac_compile(nn.Sequential(nn.Linear(24, 24), Roll()).eval(), (torch.zeros(1, 40, 24),))
    x = np.random.default_rng(1).standard_normal((1, 40, 24)).astype(np.float32)
    low = lower(m, dev, mode='f32', example=(x,))
    assert not low.check().errors and re.search(r'roll\w*_s1 = store', low.program)
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

class Roll(nn.Module):
    def forward(s, x): return torch.roll(x, 7, 1) * 2.0

class Qkv(nn.Module):
    "A qkv projection split on its last axis (maxvit's attention): 300 rows of 24 -> three slices of 8 columns."
    def __init__(s):
        super().__init__(); s.fc = nn.Linear(8, 24)
    def forward(s, x):
        q, k, v = s.fc(x).split(8, -1)
        return q * k + v

def test_slice_of_many_short_runs_in_blocks(tmp_path):
    from nac_lab.lower.attn import slice_pieces
    assert slice_pieces((1, 300, 24), 2, 0, 8, 1, 1024) is None       # 300 runs of 8 bytes: more than MAX_SLICE_PIECES copies
    # int8: 7200 + 2400 bytes whole > 1024: blocks of 16 rows, 2 * (384 + 128) = 1024 (17 rows need 2 * (448 + 192))
    dev = small_device(tmp_path, 1024)
    torch.manual_seed(0)
    m = nac_compile(Qkv().eval(), (torch.zeros(1, 300, 8),))
    rng = np.random.default_rng(8)
    xs = [rng.standard_normal((1, 300, 8)).astype(np.float32) for _ in range(3)]
    low = lower(m, dev, mode='int8', calib=xs)
    assert not low.check().errors
    blocks = re.findall(r'(\w+getitem\w*)_b(\d+) = slice\.async in \1_x\2 out \1_y\2 starts=\[\d+\] ends=\[\d+\] axes=\[1\]', low.program)
    assert len(blocks) == 3 * 19, len(blocks)                            # ceil(300 / 16) = 19 blocks per slice
    assert_bit_exact(low, xs[0])
    f32 = lower(m, small_f32(tmp_path, 4096), mode='f32', example=(xs[1],))     # f32: 28800 + 9600 bytes: 16 rows, 2 * (1536 + 512)
    assert not f32.check().errors and len(re.findall(r'getitem\w*_b\d+ = slice\.async', f32.program)) == 3 * 19
    np.testing.assert_allclose(f32.run(xs[1])[0], m.run(torch.from_numpy(xs[1]))[0].numpy(), atol=1e-5, rtol=0)
