("A layer with more operands than the sequencer tracks tokens (a 40-input concatenation, as in DenseNet's blocks) lowers to a "
 "program that stays within SEQ.max_active_tokens (`lower.nemtext.bound_live_tokens`): 0 check errors, it executes, int8 bit-exact "
 "with the independent integer reference, float equal to eager within bf16 rounding.")
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from int_reference import reference_int8

SHAPE = (1, 2, 4, 4)

class Cat40(nn.Module):
    def forward(self, x): return torch.cat([torch.relu(x * (0.5 + i / 40)) for i in range(40)], 1)

@pytest.fixture(scope='module')
def net(): return nac_compile(Cat40().eval(), (torch.zeros(SHAPE),))

def _cal(): rng = np.random.default_rng(1); return [rng.standard_normal(SHAPE).astype(np.float32) for _ in range(2)]

def test_int8_within_token_limit(net):
    low = lower(net, 'npm_pro', mode='int8', calib=_cal())
    assert not low.check().errors
    assert sum('at most 32 tokens live' in ln for ln in low.program.splitlines()) >= 40 + 2 - 32
    x = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp['x'].quantize(x))
    for o in low.graph.outputs:                    # this output is stored NCHW (a concatenation over channels of NCHW values)
        test = raw[o] if low.io['outputs'][o]['layout'] != 'NHWC' else np.transpose(raw[o], (0, 3, 1, 2))
        np.testing.assert_array_equal(test, ref[o])
    low.simulate()                                 # the timed simulation counts live tokens too: no token.limit error

def test_float_within_token_limit(net):
    low = lower(net, 'npm_pro')
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    y, = low.run(x)
    ref = Cat40()(torch.from_numpy(x)).numpy()
    assert np.abs(y - ref).max() <= 1e-2 * np.abs(ref).max()      # bf16 storage on npm_pro
