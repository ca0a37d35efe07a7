"""Activations that do not fit L2 live in DDR (issue #30: maxvit_t in f32 at 224x224 needs 16.9 MB of activations on an 8 MB L2).

`lower.api.emit_planned` spills the largest activations live at the L2 peak (`lower.place.spill_choice`) until the rest fit in 3/4
of L2; the per-layer timing programs of the tile search spill a layer's own values the same way. Checked on a residual block whose
four 32x32x16 activations (64 KiB each in f32) outgrow a small L2: bit-exact in int8, within 1e-5 in f32, nem check clean."""
import re
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.layers import LowerError
from nac_lab.lower.place import spill_choice, L2Alloc
from test_lower_tiling import small_device
from int_reference import reference_int8

class Res(nn.Module):
    def __init__(s):
        super().__init__(); s.a, s.b, s.c = (nn.Conv2d(i, 16, 3, padding=1) for i in (3, 16, 16))
    def forward(s, x):
        y = torch.relu(s.a(x)); z = torch.relu(s.b(y)); return s.c(z) + y

def model():
    torch.manual_seed(0)
    return nac_compile(Res().eval(), (torch.zeros(1, 3, 32, 32),))

XS = [np.random.default_rng(k).standard_normal((1, 3, 32, 32)).astype(np.float32) for k in range(3)]

def spilled(low) -> list: return re.findall(r'buffer (\w+)_DDR : DDR', low.program)

def test_spill_choice_takes_the_largest_first():
    a = L2Alloc()
    for n, s in (('x', 100), ('y', 1000), ('z', 300)): a.alloc(n, s)
    a.free('x'); a.alloc('w', 64)
    assert a.at_peak == {'x': (0, 128), 'y': (128, 1024), 'z': (1152, 320)} and a.peak == 1472      # w reused x's place: no new peak
    assert spill_choice(a.at_peak, 1) == {'y'} and spill_choice(a.at_peak, 1025) == {'y', 'z'}
    assert spill_choice(a.at_peak, 1025, keep={'y'}) == {'z', 'x'}

@pytest.mark.parametrize('l2, names', [(1 << 20, []), (200000, ['L12_add']), (131072, ['L4_relu', 'L12_add']),
                                       (100000, ['L4_relu', 'L8_relu', 'L12_add'])])
def test_f32_spills_only_what_does_not_fit(tmp_path, l2, names):
    m = model()
    low = lower(m, small_device(tmp_path, 65536, l2=l2), mode='f32', example=(XS[0],))
    assert spilled(low) == names and not low.check().errors
    np.testing.assert_allclose(low.run(XS[0])[0], m.run(torch.from_numpy(XS[0]))[0].numpy(), atol=1e-5, rtol=0)

def test_int8_spilled_bit_exact(tmp_path):
    m = model()
    low = lower(m, small_device(tmp_path, 65536, l2=40000), mode='int8', calib=XS)     # four 16 KiB int8 activations
    assert spilled(low) and not low.check().errors
    raw = low.run_raw(*low.quantize_inputs(XS[0]).values())
    ref = reference_int8(low.graph, low.qp, low.ql, low.qp[next(iter(low.graph.inputs))].quantize(XS[0]))
    for o in low.graph.outputs:
        got = np.transpose(raw[o], (0, 3, 1, 2)) if low.io['outputs'][o]['layout'] == 'NHWC' else raw[o]
        np.testing.assert_array_equal(got, ref[o])

def test_too_small_even_spilled(tmp_path):
    with pytest.raises(LowerError, match=r'activations need 12288 bytes of L2 at their peak .*3 spilled to DDR\); npm_small has 1000'):
        lower(model(), small_device(tmp_path, 65536, l2=1000), mode='f32', example=(XS[0],))
