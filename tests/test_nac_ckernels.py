"""The compiled CPU kernels (nac_lab.nac.runtime.ckernels, their objects in .cwrap) against PyTorch, their build cache and fallback.

Every case compares with PyTorch's own kernel within 1e-5 relative (max |c - torch| / max |torch|). Tests build into
`NAC_LAB_CACHE` (a temporary folder: conftest.py, or `tmp_path` here), never into the user's cache.
"""
import itertools, json, os, subprocess, sys
import pytest, torch
from nac_lab.nac.runtime import ckernels as ck, cwrap as cw
from nac_lab.nac.runtime.gru import GruKernel

pytestmark = pytest.mark.skipif(ck.status() != 'loaded', reason=f'C kernels not built here: {ck.status()}')

def rel(a, b): return float((a.double() - b.double()).abs().max() / b.double().abs().max())

def _conv_cases():
    "Kernel 1/3/5/7, stride 1/2, padding 0/1/3, dilation 1/2, channels off the vector width, odd and even sizes, batch 1 and 3."
    for k, s, p, d in itertools.product([1, 3, 5, 7], [1, 2], [0, 1, 3], [1, 2]):
        for ci, co, (h, w), n in [(3, 8, (9, 10), 1), (5, 19, (12, 11), 3), (16, 33, (8, 8), 1)]:
            if h + 2 * p >= d * (k - 1) + 1 and w + 2 * p >= d * (k - 1) + 1: yield k, s, p, d, ci, co, h, w, n

CONV_CASES = list(_conv_cases())

def test_conv_case_count():
    # 48 geometries x 3 shapes = 144, less the empty outputs: kernel 7 dilation 2 spans 13 (9x10 and 8x8 at padding 0 and 1,
    # 12x11 at padding 0: 5 per stride), kernel 5 dilation 2 spans 9 (8x8 at padding 0: 1 per stride): 144 - 12
    assert len(CONV_CASES) == 132

@pytest.mark.parametrize('k,s,p,d,ci,co,h,w,n', CONV_CASES)
def test_conv2d(k, s, p, d, ci, co, h, w, n):
    g = torch.Generator().manual_seed(k * 1000 + s * 100 + p * 10 + d + ci)
    wt, b, x = torch.randn(co, ci, k, k, generator=g), torch.randn(co, generator=g), torch.randn(n, ci, h, w, generator=g)
    kern = cw.conv_kernel(wt, b, [s, s], [p, p], [d, d], 1)
    assert type(kern) is cw.CConv2d
    got = kern(x, wt, b, [s, s], [p, p], [d, d], 1)
    assert kern.plans[(n, ci, h, w)] is not None          # the C path ran, not the fallback
    assert rel(got, torch.conv2d(x, wt, b, s, p, d)) <= 1e-5

# the geometries whose output is not empty: kernel 7 dilation 2 spans 13 (sides 9 and 8 at padding 0 and 1: 4 per stride),
# kernel 5 dilation 2 spans 9 (side 8 at padding 0: 1 per stride), so 144 - 10
DW_CASES = [(k, s, p, d, c, h, w, n) for k, s, p, d in itertools.product([1, 3, 5, 7], [1, 2], [0, 1, 3], [1, 2])
            for c, h, w, n in [(3, 9, 10, 1), (17, 16, 15, 3), (72, 8, 8, 1)]
            if min(h, w) + 2 * p >= d * (k - 1) + 1]

def test_depthwise_case_count(): assert len(DW_CASES) == 48 * 3 - 10

@pytest.mark.parametrize('k,s,p,d,c,h,w,n', DW_CASES)
def test_depthwise(k, s, p, d, c, h, w, n):
    g = torch.Generator().manual_seed(k * 1000 + s * 100 + p * 10 + d + c)
    wt, b, x = torch.randn(c, 1, k, k, generator=g), torch.randn(c, generator=g), torch.randn(n, c, h, w, generator=g)
    kern = cw.conv_kernel(wt, b, [s, s], [p, p], [d, d], c)
    assert type(kern) is cw.CDwConv2d
    assert rel(kern(x, wt, b, [s, s], [p, p], [d, d], c), torch.conv2d(x, wt, b, s, p, d, c)) <= 1e-5

@pytest.mark.parametrize('act,lo,hi', [(('relu',), 0.0, None), (('clamp', 0.0, 6.0), 0.0, 6.0), (('clamp', -1.0, 0.5), -1.0, 0.5)])
def test_fused_clamp(act, lo, hi):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 7, 6, generator=g); x[0, 0, 0, 0] = float('nan')
    for wt, grp in ((torch.randn(9, 4, 3, 3, generator=g), 1), (torch.randn(4, 1, 3, 3, generator=g), 4)):
        kern = cw.conv_kernel(wt, None, [1, 1], [1, 1], [1, 1], grp, act)
        got, want = kern(x, wt, None, [1, 1], [1, 1], [1, 1], grp), torch.conv2d(x, wt, None, 1, 1, 1, grp).clamp(lo, hi)
        assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()      # NaN passes through the clamp, as in torch
        assert rel(got.nan_to_num(), want.nan_to_num()) <= 1e-5 and float(got.nan_to_num().min()) >= lo

@pytest.mark.parametrize('hid,seq,n,h0', [(h, t, n, h0) for h in (8, 64, 100) for t in (1, 7, 32) for n, h0 in ((1, False), (3, True))])
def test_gru(hid, seq, n, h0):
    g = torch.Generator().manual_seed(hid + seq)
    P = [torch.randn(3 * hid, 12, generator=g) * .3, torch.randn(3 * hid, hid, generator=g) * .3, torch.randn(3 * hid, generator=g) * .1,
         torch.randn(3 * hid, generator=g) * .1]
    k = GruKernel(*P)
    assert k.c is not None
    x = torch.randn(n, seq, 12, generator=g)
    hx = torch.randn(1, n, hid, generator=g) * .5 if h0 else torch.zeros(1, n, hid)
    (y, hn), (yw, hw) = k(x, hx, P, True, 1, 0.0, False, False, True), torch.gru(x, hx, P, True, 1, 0.0, False, False, True)
    assert y.shape == yw.shape and hn.shape == hw.shape
    assert rel(y, yw) <= 1e-5 and rel(hn, hw) <= 1e-5

def test_guards_fall_back():
    "Calls the plan does not cover run PyTorch's kernel: other weights, float64, strided input, other geometry, empty batch."
    g = torch.Generator().manual_seed(0)
    wt, b, x = torch.randn(8, 4, 3, 3, generator=g), torch.randn(8, generator=g), torch.randn(2, 4, 6, 6, generator=g)
    k = cw.conv_kernel(wt, b, [1, 1], [1, 1], [1, 1], 1)
    w2 = wt.clone()
    assert torch.equal(k(x, w2, b, [1, 1], [1, 1], [1, 1], 1), torch.conv2d(x, w2, b, 1, 1))
    xd, wd, bd = x.double(), wt.double(), b.double()
    assert torch.equal(k(xd, wd, bd, [1, 1], [1, 1], [1, 1], 1), torch.conv2d(xd, wd, bd, 1, 1))
    xt = x.transpose(2, 3)
    assert torch.equal(k(xt, wt, b, [1, 1], [1, 1], [1, 1], 1), torch.conv2d(xt, wt, b, 1, 1))
    assert torch.equal(k(x, wt, b, [2, 2], [1, 1], [1, 1], 1), torch.conv2d(x, wt, b, 2, 1))
    assert k(x[:0], wt, b, [1, 1], [1, 1], [1, 1], 1).shape == (0, 8, 6, 6)
    with pytest.raises(RuntimeError): k(torch.randn(1, 3, 6, 6), wt, b, [1, 1], [1, 1], [1, 1], 1)   # torch's own error

def test_scratch_cap(monkeypatch):
    "An image whose padded copy would pass MAX_SCRATCH floats is not planned: PyTorch's kernel runs."
    monkeypatch.setattr(cw, 'MAX_SCRATCH', 1000)
    wt = torch.randn(2, 3, 3, 3)
    k = cw.conv_kernel(wt, None, [1, 1], [1, 1], [1, 1], 1)
    x = torch.randn(1, 3, 20, 20)
    assert torch.equal(k(x, wt, None, [1, 1], [1, 1], [1, 1], 1), torch.conv2d(x, wt, None, 1, 1))
    assert k.plans[(1, 3, 20, 20)] is None and k(torch.ones(1, 3, 4, 4), wt, None, [1, 1], [1, 1], [1, 1], 1).shape == (1, 2, 4, 4)
    assert k.plans[(1, 3, 4, 4)] is not None

def test_plan_refusals():
    assert cw.conv_kernel(torch.ones(4, 2, 3, 3), None, [1, 1], [0, 0], [1, 1], 2) is None          # grouped, not depthwise
    assert cw.conv_kernel(torch.ones(4, 1, 3, 3).double(), None, [1, 1], [0, 0], [1, 1], 1) is None
    assert cw.conv_kernel(torch.ones(4, 1, 3, 3), torch.ones(3), [1, 1], [0, 0], [1, 1], 1) is None   # bias of the wrong size
    assert cw.conv_kernel(torch.ones(4, 1, 3, 3), None, [0, 1], [0, 0], [1, 1], 1) is None           # stride 0
    assert cw.conv_kernel(torch.ones(4, 1, 3, 3), None, [1, 1], [-1, 0], [1, 1], 1) is None          # negative padding
    assert cw.conv_kernel(torch.ones(4, 1, 3, 3), None, 'same', [0, 0], [1, 1], 1) is None

def test_cache_name_and_rebuild(tmp_path):
    src = ck.source()
    assert ck.lib_name(src, ck.FLAGS, 'v') != ck.lib_name(src.replace('ck_abi', 'ck_abi '), ck.FLAGS, 'v')
    assert ck.lib_name(src, ck.FLAGS, 'v') != ck.lib_name(src, ck.FLAGS, 'w')          # another compiler version
    p = ck.build(src, folder=tmp_path)
    assert p.parent == tmp_path and p.name.startswith('ckernels-') and ck.elf_complete(p)
    p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2])         # truncated: dlopen would fault on it
    assert not ck.elf_complete(p)
    ffi, lib = ck.load(src, folder=tmp_path)
    assert lib.ck_abi() == ck.ABI and ck.elf_complete(p)
    assert [f.name for f in tmp_path.iterdir()] == [p.name]

def test_failed_compile(tmp_path):
    with pytest.raises(OSError, match='failed'): ck.build('this is not C', folder=tmp_path)
    assert list(tmp_path.iterdir()) == []                            # no temporary files left

_PROBE = '''
import json, torch
from torch.export import Dim
from nac_lab.nac.compiler.zoo import build_model, example_inputs
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.nac.runtime import ckernels
m = build_model('mobilenet')
nm = nac_compile(m, example_inputs('mobilenet', 2), dynamic_shapes=({0: Dim.AUTO},))
kinds = sorted({type(k).__name__ for k in nm.interpreter.kernel_plan.values() if type(k).__module__.endswith('cwrap')})
print(json.dumps([ckernels.status(), kinds, nm.run(*example_inputs('mobilenet', 3, seed=5))[0].tolist()]))
'''

def _probe(**env):
    r = subprocess.run([sys.executable, '-c', _PROBE], capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])

def test_fallback_same_outputs(tmp_path):
    "Disabled (NAC_LAB_CKERNELS=0) or without a compiler, the plan holds PyTorch's kernels only and the outputs agree."
    on = _probe()
    off = _probe(NAC_LAB_CKERNELS='0')
    nocc = _probe(CC=str(tmp_path / 'no-such-cc'), NAC_LAB_CACHE=str(tmp_path / 'cache'))
    assert on[:2] == ['loaded', ['CConv2d', 'CDwConv2d', 'CPool']]
    assert off[:2] == ['disabled by NAC_LAB_CKERNELS=0', []] and nocc[:2] == ['OSError: no C compiler (cc) on the PATH', []]
    assert off[2] == nocc[2]
    assert rel(torch.tensor(on[2]), torch.tensor(off[2])) <= 1e-6

POOL_CASES = [(k, s, p, d) for k in (1, 2, 3) for s in ([], 1, 2, 3) for p in (0, 1) for d in (1, 2) if 2 * p <= k]

@pytest.mark.parametrize('k,s,p,d', POOL_CASES)
@pytest.mark.parametrize('shape', [(1, 3, 9, 10), (3, 5, 16, 16), (2, 2, 7, 33)])
def test_max_pool2d(k, s, p, d, shape):
    "Max pooling is exact: equal to torch.max_pool2d bit for bit, NaN where torch has NaN, -inf inputs included."
    g = torch.Generator().manual_seed(k * 100 + p * 10 + d)
    x = torch.randn(*shape, generator=g)
    x[0, 0, 1, 1], x[-1, -1, 2, 3], x[0, -1, 0, :] = float('nan'), float('-inf'), float('inf')
    args = ([k, k], [] if s == [] else [s, s], [p, p], [d, d], False)
    kern = cw.pool_kernel('max', args)
    got, want = kern(x, *args), torch.max_pool2d(x, *args)
    assert kern.plans[shape] is not None
    assert got.shape == want.shape and torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())

def test_pool_refusals_and_mean():
    assert cw.pool_kernel('max', ([2, 2], [2, 2], [0, 0], [1, 1], True)) is None       # ceil mode: PyTorch's kernel
    assert cw.pool_kernel('max', ([2, 2], [2, 2], [2, 2], [1, 1], False)) is None      # padding over half the window
    assert cw.pool_kernel('mean', ([2, 2],)) is None                                    # only the global 1×1 average
    kern = cw.pool_kernel('mean', ([1, 1],))
    x = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2)
    assert kern(x, [1, 1]).flatten().tolist() == [1.5 + 4 * i for i in range(6)]      # by hand: mean of 4i..4i+3
    g = torch.Generator().manual_seed(9)
    x = torch.randn(3, 64, 7, 5, generator=g)
    assert rel(kern(x, [1, 1]), torch._C._nn.adaptive_avg_pool2d(x, [1, 1])) <= 1e-6

def test_gru_nan_and_saturation():
    "The vector exp keeps NaN (a NaN input makes every later output NaN, as in torch) and saturates large gates to 0, 1 and -1."
    P = [torch.ones(12, 2), torch.ones(12, 4), torch.zeros(12), torch.zeros(12)]
    k = GruKernel(*P)
    for x in (torch.tensor([[[float('nan'), 0.0], [0.0, 0.0]]]), torch.tensor([[[100.0, -100.0], [-300.0, 0.0], [1e-4, 0.0]]])):
        h0 = torch.zeros(1, 1, 4)
        got, want = k(x, h0, P, True, 1, 0.0, False, False, True)[0], torch.gru(x, h0, P, True, 1, 0.0, False, False, True)[0]
        assert torch.equal(got.isnan(), want.isnan())
        assert float((got.nan_to_num() - want.nan_to_num()).abs().max()) <= 1e-6

def test_concurrent_builds(tmp_path):
    "Two processes building into the same empty cache at once: both load a whole library, one file remains, no temporaries."
    code = 'from nac_lab.nac.runtime import ckernels as c; print(c.status(), c.library()[1].ck_abi())'
    env = {**os.environ, 'NAC_LAB_CACHE': str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [o.strip() for o, _ in outs] == [f'loaded {ck.ABI}'] * 2, [e[-500:] for _, e in outs]
    files = [f.name for f in tmp_path.iterdir()]
    assert len(files) == 1 and files[0].startswith('ckernels-') and ck.elf_complete(tmp_path / files[0])
