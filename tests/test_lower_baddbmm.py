"lower.attn's baddbmm branches (computed `self` with beta != 1, beta = 0, a parameter `self`, a broadcasting `self`) on tiny modules."
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.layers import LowerError
from f32_device import f32_device
from test_lower_more import _int8

@pytest.fixture(scope='module')
def f32dev(tmp_path_factory):
    return f32_device(tmp_path_factory.mktemp('dev'), ('view<f32>.default', 'gemm.float<f32>.no_bias'))

class Bmm(nn.Module):
    "y = linear(x); baddbmm(self, y, yᵀ, beta, alpha); `self`: computed y[..., :4], a [1, 4, 4] parameter or a broadcasting y[:, :1, :4]."
    def __init__(s, self_kind, beta, alpha=1.0):
        super().__init__(); s.l, s.kind, s.beta, s.alpha = nn.Linear(6, 6), self_kind, beta, alpha
        s.p = nn.Parameter(torch.randn(1, 4, 4))
    def forward(s, x):
        y = s.l(x)
        me = {'computed': lambda: y[..., :4] * 1.0, 'param': lambda: s.p, 'broadcast': lambda: y[:, :1, :4] * 1.0}[s.kind]()
        return torch.baddbmm(me, y, y.transpose(1, 2), beta=s.beta, alpha=s.alpha)

CASES = {'computed_beta_half': ('computed', 0.5, 2.0), 'computed_beta1': ('computed', 1.0), 'beta0': ('computed', 0.0, 0.5),
         'param_beta_half': ('param', 0.5)}

OPS = {'computed_beta_half': ['matmul', 'mul_c', 'mul_c', 'add'],   # alpha·(b1@b2), beta·self, their sum
       'computed_beta1': ['matmul', 'add'],                           # no scale at 1
       'beta0': ['matmul', 'mul_c'],                                  # beta = 0: `self` is not read, only alpha scales
       'param_beta_half': ['const', 'matmul', 'add']}                 # beta·self folded into one constant

def _model(name):
    torch.manual_seed(0)
    return nac_compile(Bmm(*CASES[name]).eval(), (torch.zeros(1, 4, 6),))

@pytest.mark.parametrize('name', list(CASES))
def test_baddbmm_f32(f32dev, name):
    m = _model(name)
    x = np.random.default_rng(1).standard_normal((1, 4, 6)).astype(np.float32)
    low = lower(m, f32dev, mode='f32', example=(x,))
    assert not low.check().errors
    ops = [l.op for l in low.graph.layers if l.name.startswith('L6_')]     # the baddbmm's layers
    assert ops == OPS[name]
    np.testing.assert_allclose(low.run(x)[0], m.run(torch.from_numpy(x))[0].numpy(), atol=1e-4, rtol=0)

@pytest.mark.parametrize('name', list(CASES))
def test_baddbmm_int8_bit_exact(name):
    _int8(_model(name), (1, 4, 6))

def test_baddbmm_broadcasting_computed_self_is_refused():
    torch.manual_seed(0)
    m = nac_compile(Bmm('broadcast', 0.5).eval(), (torch.zeros(1, 4, 6),))
    with pytest.raises(LowerError, match='baddbmm with a computed input that broadcasts is not lowered'):
        lower(m, 'npm_pro', mode='f32', example=(np.zeros((1, 4, 6), np.float32),))
