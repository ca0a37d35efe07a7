"""Attention masks of the lowest float in int8 (issue #30, transformers gpt_neo): a masked fill `where(causal, s, finfo.min)` and an
additive mask of finfo.min (their sum overflows to -inf) become the softmax island's f16 mask, so no int8 value has to hold them;
the masked probabilities stay exactly 0 and the program is bit-exact with the independent integer reference."""
import numpy as np, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.graph import import_nac
from nac_lab.lower.ops import fuse_masks
from int_reference import reference_int8

LOW = torch.finfo(torch.float32).min

class Masked(nn.Module):
    "Causal scores of 6 tokens: a masked fill and an additive mask, both of the lowest float, then softmax."
    def __init__(s):
        super().__init__(); s.q, s.k = nn.Linear(8, 8), nn.Linear(8, 8)
    def forward(s, x):
        a = s.q(x) @ s.k(x).transpose(1, 2)
        causal = torch.ones(6, 6, dtype=torch.bool).tril()
        a = torch.where(causal, a, LOW)
        return torch.softmax(a + torch.where(causal, 0.0, LOW), -1)

def _model():
    torch.manual_seed(0)
    return nac_compile(Masked().eval(), (torch.zeros(1, 6, 8),))

def test_masked_fill_and_mask_fuse_into_the_softmax():
    g = fuse_masks(import_nac(_model(), np.zeros((1, 6, 8), np.float32)))
    sm = next(l for l in g.layers if l.op == 'softmax')
    want = np.where(np.tri(6, dtype=bool), 0.0, -np.inf)                      # -inf above the diagonal, 0 on and below it
    np.testing.assert_array_equal(sm.params['mask'].reshape(6, 6), want)
    assert not [l for l in g.layers if l.op == 'const'] and g.layer(sm.inputs[0]).op == 'matmul'

def test_int8_masked_softmax_exact():
    m = _model()
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((1, 6, 8)).astype(np.float32) for _ in range(3)]
    low = lower(m, 'npm_pro', mode='int8', calib=xs)
    assert not low.check().errors
    x = xs[0]
    raw = low.run_raw(*low.quantize_inputs(x).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(x))
    o = low.graph.outputs[0]
    np.testing.assert_array_equal(raw[o], ref[o])
    p = low.run(x)[0].reshape(6, 6)
    assert (p[~np.tri(6, dtype=bool)] == 0).all()                              # masked: exactly 0, as exp(finfo.min - max) in float
    np.testing.assert_allclose(p, m.run(torch.from_numpy(x))[0].numpy().reshape(6, 6), atol=0.02)
