("The constants' copies to L2 as a few large transfers from the first cycle (`lower.nemtext.coalesce_loads`): fewer load tokens, the "
 "same DDR bytes (up to alignment), bit-exact results, and on mobilenet_v2 at 224x224 the classifier's weights in L2 before the last "
 "convolution starts.")
import re
import numpy as np, torch
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from lower_checks import assert_int8_bit_exact

def _mobilenet(size):
    from nac_lab.bench.peers import import_torchvision
    tv = import_torchvision()
    torch.manual_seed(0)
    shape = (1, 3, size, size)
    m = nac_compile(tv.models.mobilenet_v2(weights=None).eval(), (torch.zeros(shape),))
    rng = np.random.default_rng(0)
    return m, shape, [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]

def _loads(low): return [ln for ln in low.program.splitlines() if re.match(r't\d+_\w+_load\d* = transfer\.async', ln)]

def test_coalesced_fewer_tokens_same_bytes_bit_exact(monkeypatch):
    m, shape, cal = _mobilenet(64)
    low = lower(m, 'npm_pro', mode='int8', calib=cal)
    assert not low.check().errors and 'buffer CPACK_L2 : L2' in low.program
    assert_int8_bit_exact(low, shape, [1])
    import nac_lab.lower.emit as em
    monkeypatch.setattr(em, 'coalesce_loads', lambda *a, **k: None)
    one = lower(m, 'npm_pro', mode='int8', calib=cal)             # one copy per constant, as before
    assert 'CPACK' not in one.program
    n, k = len(_loads(one)), len(_loads(low))
    consts = sum(1 for b in one.data if b + '_L2' in one.program)
    assert consts > 100 and n >= consts and k <= 3 * 12, (n, k)   # ~110 copies -> a dozen segments of at most 3 parts
    ddr = lambda lo: lo.simulate().table.level_bytes['DDR']['read']
    assert ddr(one) <= ddr(low) <= ddr(one) + 64 * consts        # the same bytes, plus the padding between packed constants
    assert low.data['CPACK'].nbytes == sum(-(-a.nbytes // 64) * 64 for b, a in one.data.items() if b + '_L2' in one.program)

def test_classifier_weights_arrive_before_the_last_conv():
    m, shape, cal = _mobilenet(224)
    low = lower(m, 'npm_pro', mode='int8', calib=cal)
    res = low.simulate(); tb = res.table
    names = [tb.name(j) for j in range(tb.n)]
    loads = [j for j, n in enumerate(names) if '_CPACK' in n and '_load' in n]
    convs = sorted({int(x) for n in names for x in re.findall(r'_L(\d+)_conv2d_', n)})
    last = min(res.start[j] for j, n in enumerate(names) if f'_L{convs[-1]}_conv2d_' in n)
    fc = [m_.group(1) for n in names if (m_ := re.search(r'_(L\d+_linear)_', n))]
    assert fc and max(res.end[j] for j in loads) < last          # every constant (the classifier's 1.28 MB too) is in L2 by then
    rf = low.roofline(res)
    assert res.total_cycles < 1.9 * 57711 and rf['ratio'] < 1.85, (res.total_cycles, rf)   # 134,463 cycles (2.33x) before
    # issue #30's goal: within 1.5x of the roofline bound (79,868 cycles = 1.30x of its L2 bound 61,588 when this was written)
    assert rf['ratio'] <= 1.5, rf

def test_copies_in_parts_over_the_sdmas():
    ("npm_pro has 4 sDMAs: the 12,288-byte input in 3 parts (parts of at least 4 KiB), each large constant segment in 3 (one sDMA "
     "left for the rest); npm_lite's one sDMA: the input in one part (its constants stream through the weight ring, not packed).")
    m, shape, cal = _mobilenet(64)
    for dev, nin, nseg in (('npm_pro', 3, 3), ('npm_lite', 1, None)):
        low = lower(m, dev, mode='int8', calib=cal)
        pat = r'^t\d+_x_in\d* = transfer\.async\(dst=region\(\w+, (\d+), (\d+)\), src=region\(x, (\d+), (\d+)\)\)$'
        ins = re.findall(pat, low.program, re.M)
        assert len(ins) == nin and sum(int(b) for _, b, _, _ in ins) == int(np.prod(shape)), (dev, ins)
        assert [int(o) for _, _, o, _ in ins] == sorted(int(o) for _, _, o, _ in ins) and all(int(o) % 64 == 0 for _, _, o, _ in ins)
        segs = {}
        for t in re.findall(r'^t\d+_(CPACK\d+)_load\d* = ', low.program, re.M): segs[t] = segs.get(t, 0) + 1
        assert (max(segs.values()), list(segs.values())[-1]) == (nseg, nseg) if nseg else not segs, (dev, segs)
        assert_int8_bit_exact(low, shape, [0])
