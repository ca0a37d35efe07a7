"""Constants the L2 budget leaves in DDR (`Emitter.const(..., l2=False)`: no load token) must not put a missing token into
a task's deps: vgg11 at 64×64 failed with a bare TypeError in its `take` indices. Forcing every constant into DDR, the
program still passes `nem check` and computes exactly what the L2 program computes."""
import numpy as np, torch, torch.nn as nn, torch.nn.functional as F
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.emit import Emitter

class Consts(nn.Module):
    "A non-uniform adaptive pool (slices gathered with `take`), a scalar scale and shift (constant tensors), an embedding-free gather path."
    def forward(s, x): return F.adaptive_avg_pool2d(torch.relu(x * 2.0 + 1.0), 3)

def test_constants_left_in_ddr(monkeypatch):
    m = nac_compile(Consts().eval(), (torch.zeros(1, 4, 5, 5),))
    x = np.random.default_rng(0).standard_normal((1, 4, 5, 5)).astype(np.float32)
    ref = lower(m, 'npm_lite', mode='float', example=(x,))
    ops = {l.op for l in ref.graph.layers}
    assert {'take', 'add_c', 'mul_c'} <= ops, ops
    orig = Emitter.const
    monkeypatch.setattr(Emitter, 'const', lambda self, name, arr, l2=True, **kw: orig(self, name, arr, False, **kw))
    low = lower(m, 'npm_lite', mode='float', example=(x,))
    l2_copies = lambda low: [ln for ln in low.program.splitlines() if ln.startswith('buffer') and '_L2 : L2' in ln and 'ACT_L2' not in ln]
    assert l2_copies(ref) and not l2_copies(low)                      # every constant stays in DDR
    assert not low.check().errors
    np.testing.assert_array_equal(low.run(x)[0], ref.run(x)[0])
