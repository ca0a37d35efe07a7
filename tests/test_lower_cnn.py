("The CNN ops of lower.cnn, one tiny module each: float (f32) within 1e-4 of the NAC interpreter, int8 bit-exact with the independent "
 "integer reference, nem check clean.")
import re
import numpy as np, pytest, torch, torch.nn as nn, torch.nn.functional as F
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.layers import LowerError
from f32_device import f32_device
from int_reference import reference_int8

@pytest.fixture(scope='module')
def f32dev(tmp_path_factory):
    "npm_pro_x1 plus f32 view and norm variants: every layer of these modules lowers in f32."
    return f32_device(tmp_path_factory.mktemp('dev'), ('norm<f32>.default', 'view<f32>.default', 'gemm.float<f32>.no_bias'))

class Fn(nn.Module):
    "conv (with a batch norm after a relu) then `f`."
    def __init__(s, f, cin=3, c=4):
        super().__init__(); s.c, s.bn, s.f = nn.Conv2d(cin, c, 3, padding=1), nn.BatchNorm2d(c), f
        with torch.no_grad(): s.bn.running_mean.uniform_(-0.5, 0.5); s.bn.running_var.uniform_(0.5, 2); s.bn.weight.uniform_(0.5, 1.5)
    def forward(s, x): return s.f(s.bn(torch.relu(s.c(x))))

class SE(nn.Module):
    def __init__(s):
        super().__init__(); s.fc1, s.fc2 = nn.Conv2d(4, 2, 1), nn.Conv2d(2, 4, 1)
    def forward(s, y): return y * F.hardsigmoid(s.fc2(F.relu(s.fc1(y.mean((2, 3), keepdim=True)))))

class GN(nn.Module):
    def __init__(s):
        super().__init__(); s.g = nn.GroupNorm(2, 4)
        with torch.no_grad(): s.g.weight.uniform_(0.5, 1.5); s.g.bias.uniform_(-1, 1)
    def forward(s, y): return s.g(y)

class C1(nn.Module):
    def __init__(s):
        super().__init__(); s.c = nn.Conv1d(4, 5, 3, padding=1, stride=2)
    def forward(s, y): return s.c(y.mean(2))

class Lin(nn.Module):
    def __init__(s):
        super().__init__(); s.w, s.b = nn.Parameter(torch.randn(4, 3)), nn.Parameter(torch.randn(3))
    def forward(s, y):
        z = y.mean((2, 3)); return torch.addcmul(torch.addmm(s.b, z, s.w), torch.addmm(s.b, z, s.w), torch.addmm(s.b, z, s.w), value=0.5)

CASES = {
    'gap': lambda y: y.mean((2, 3)),
    'gap_keepdim_unsqueeze': lambda y: y.mean((2, 3), keepdim=True).squeeze(-1).unsqueeze(0),
    'maxpool_ceil': lambda y: F.max_pool2d(y, 3, 2, ceil_mode=True),
    'avgpool_ceil': lambda y: F.avg_pool2d(y, 2, 2, ceil_mode=True),
    'avgpool_count_pad': lambda y: F.avg_pool2d(y, 3, 2, 1, ceil_mode=True, count_include_pad=True),     # overhangs: pad + pool
    'avgpool_count_pad_dw': lambda y: F.avg_pool2d(y, 3, 2, 1, count_include_pad=True),                  # a depthwise conv
    'pad': lambda y: F.pad(y, (1, 2, 0, 1), value=0.0),
    'strided_slice': lambda y: y[:, 1:, ::2, 1::2],
    'upsample': lambda y: F.interpolate(y, scale_factor=2, mode='nearest'),
    'relu6_hardswish': lambda y: F.hardswish(F.relu6(y) - 1.0),
    'hardtanh_silu': lambda y: F.silu(F.hardtanh(y, -0.5, 0.5)),
    'mish': F.mish,
    'adaptive_max': lambda y: F.adaptive_max_pool2d(y, (2, 2)),
    'se': SE(), 'group_norm': GN(), 'conv1d': C1(), 'addmm_addcmul': Lin(),
}
SHAPE = (1, 3, 8, 8)

def _model(name, seed=0):
    torch.manual_seed(seed)
    return nac_compile(Fn(CASES[name]).eval(), (torch.zeros(SHAPE),))

@pytest.mark.parametrize('name', list(CASES))
def test_float_f32(f32dev, name):
    m = _model(name)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
    low = lower(m, f32dev, mode='f32', example=(x,))
    assert not low.check().errors
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

@pytest.mark.parametrize('name', list(CASES))
def test_int8_bit_exact(name):
    m = _model(name, seed=2)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(3)]
    low = lower(m, 'npm_pro', mode='int8', calib=xs)
    assert not low.check().errors
    x = xs[0]                                           # a calibration sample: no clipping, so the float bound below is tight
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
    for o in low.graph.outputs:
        got = np.transpose(raw[o], (0, 3, 1, 2)) if low.io['outputs'][o]['layout'] == 'NHWC' else raw[o]      # NEM layout -> PyTorch
        np.testing.assert_array_equal(got, ref[o])
    y, yr = low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy()        # and close to the float model (a loose sanity bound)
    assert np.abs(y - yr).max() <= 0.1 * np.abs(yr).max() + 0.02

class Cmp(nn.Module):
    def forward(s, x): return (x > 0).float() * x

def test_comparison_is_refused_with_its_instruction():
    m = nac_compile(Cmp().eval(), (torch.zeros(1, 4),))
    with pytest.raises(LowerError, match=r'instruction \d+ \(nac\.gt\).*no comparison instruction'):
        lower(m, 'npm_pro', mode='float', example=(np.ones((1, 4), np.float32),))

def test_cli_lowers_a_symbolic_batch_zoo_model_with_no_flags(tmp_path):
    "`zoo build cnn` (dynamic batch: its view reads nac.size) then `nem lower M --device D`: float from the signature, batch 1."
    import contextlib, io, json
    from nac_lab.cli import main
    def cli(*a):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = main([str(x) for x in a])
        return rc, out.getvalue(), err.getvalue()
    rc, _, err = cli('zoo', 'build', 'cnn', '-o', tmp_path / 'cnn.nac')
    assert not rc, err
    rc, out, err = cli('nem', 'lower', tmp_path / 'cnn.nac', '--device', 'npm_pro', '-o', tmp_path / 'o')
    assert not rc and '(bf16 on npm_pro)' in out and 'nem check: 0 errors' in out, err
    assert json.loads((tmp_path / 'o' / 'io.json').read_text())['inputs']['x']['shape'][0] == 1
    rc, out, err = cli('nem', 'lower', tmp_path / 'cnn.nac', '--device', 'npm_pro', '--batch', 2, '--json', '-o', tmp_path / 'o2')
    assert not rc and json.loads(out)['inputs']['x'][0] == 2, err

def test_a_program_the_checker_rejects_is_a_lower_error():
    from nac_lab.lower.api import checked
    x = np.zeros(SHAPE, np.float32)
    low = lower(_model('gap'), 'npm_pro', mode='float', example=(x,))
    assert checked(low) is low
    low.program = low.program.replace('buffer ACT_L2 : L2 (size=', 'buffer ACT_L2 : L2 (size=99999999', 1)    # 100 MB in an 8 MB L2
    with pytest.raises(LowerError, match=r'fails nem check on npm_pro with \d+ error\(s\), first: \S+: '):
        checked(low)

def test_avgpool_counting_padding_is_a_depthwise_conv_unless_it_overhangs():
    "count_include_pad without a ceil_mode overhang: one depthwise conv2d of weights 1/9; with an overhang: pad, then avgpool."
    ops = {n: [l.op for l in lower(_model(n), 'npm_pro', mode='float', example=(np.zeros(SHAPE, np.float32),)).graph.layers][3:]
           for n in ('avgpool_count_pad', 'avgpool_count_pad_dw')}                 # after Fn's conv, relu, conv
    assert ops == {'avgpool_count_pad': ['pad', 'avgpool'], 'avgpool_count_pad_dw': ['conv2d']}, ops
    w = next(l for l in lower(_model('avgpool_count_pad_dw'), 'npm_pro', mode='float', example=(np.zeros(SHAPE, np.float32),)).graph.layers
             if l.op == 'conv2d' and l.attrs['strides'] == [2, 2]).params['w']
    assert w.shape == (4, 1, 3, 3) and np.all(w == np.float32(1 / 9))

def test_global_pool_taller_than_l1_in_two_stages(tmp_path):
    "A 32x32x8 global mean on a 16 KiB L1: one output row needs 2 * (32*32*8*4 + 64) bytes, so bands of 4 rows, then 8 of them."
    from test_lower_tiling import small_device
    from int_reference import reference_int8
    dev = small_device(tmp_path, 16384)
    torch.manual_seed(0)
    m = nac_compile(Fn(lambda y: y.mean((2, 3)), c=8).eval(), (torch.zeros(1, 3, 32, 32),))
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(3)]
    low = lower(m, dev, mode='f32', example=(xs[0],))
    pools = [l.attrs['kernel_shape'] for l in low.graph.layers if l.op == 'avgpool']
    assert pools == [[4, 32], [8, 1]], pools                # 2 * (4*1024 + 64) = 8320 <= 16384; 8 rows would need 16512
    assert not low.check().errors
    np.testing.assert_allclose(low.run(xs[0])[0], m.run(torch.from_numpy(xs[0]))[0].numpy(), atol=1e-5, rtol=0)
    q = lower(m, dev, mode='int8', calib=xs)
    assert not q.check().errors
    raw = q.run_raw(*q.quantize_inputs(xs[0]).values())
    ref = reference_int8(q.graph, q.qp, q.ql, q.qp[next(iter(q.graph.inputs))].quantize(xs[0]))
    for o in q.graph.outputs: np.testing.assert_array_equal(raw[o], ref[o])

def test_channel_scale_larger_than_l1_in_row_bands(tmp_path):
    "Squeeze-excitation on 32x32x8 with a 16 KiB L1: the bmul (32 KiB in and out in f32) runs in row bands, the scale loaded once."
    from test_lower_tiling import small_device
    from int_reference import reference_int8
    dev = small_device(tmp_path, 16384)
    torch.manual_seed(0)
    m = nac_compile(Fn(lambda y: y * torch.sigmoid(y.mean((2, 3), keepdim=True)), c=8).eval(), (torch.zeros(1, 3, 32, 32),))
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(3)]
    low = lower(m, dev, mode='f32', example=(xs[0],))
    bm = next(l.name for l in low.graph.layers if l.op == 'bmul')
    bands = re.findall(rf'{bm}_b\d+ = conv2d\.async in {bm}_x\d+, {bm}_w @readonly', low.program)
    # a row is 32*8*4 = 1024 bytes in and out; 4 rows: 64 + 2*(4096 + 4096) = 16448 > 16384; 3 rows fit: ceil(32/3) = 11 bands
    assert len(bands) == 11 and low.program.count(f'{bm}_w = transfer.async') == 1
    assert not low.check().errors
    np.testing.assert_allclose(low.run(xs[0])[0], m.run(torch.from_numpy(xs[0]))[0].numpy(), atol=1e-5, rtol=0)
    q = lower(m, dev, mode='int8', calib=xs)
    assert not q.check().errors and re.search(rf'{bm}_b1 = conv2d\.async', q.program)
    raw = q.run_raw(*q.quantize_inputs(xs[0]).values())
    ref = reference_int8(q.graph, q.qp, q.ql, q.qp[next(iter(q.graph.inputs))].quantize(xs[0]))
    for o in q.graph.outputs:          # stored NHWC -> PyTorch's NCHW
        np.testing.assert_array_equal(np.transpose(raw[o], (0, 3, 1, 2)) if q.io['outputs'][o]['layout'] == 'NHWC' else raw[o], ref[o])
