"""yosys cost of the generated hardware: the coarse stage without the pairwise write-port passes counts what `memory -nomap`
counts, and a 16x16 array finishes."""
import os
import numpy as np, pytest
import nac_lab.hw.cost as hc
from nac_lab.hw.layer import HwLayer
from nac_lab.hw.gen import HwConfig, generate
from nac_lab.hw.sim import tool_available

pytestmark = pytest.mark.skipif(not tool_available('yosys'), reason='yosys not installed: tools/bootstrap.sh --test')

def _layer(W, C, Co, seed=5):
    "A 1x1 convolution over a 1 x W image (W pixels, C -> Co channels), made by hand."
    rng = np.random.default_rng(seed)
    return HwLayer('p', 'conv', 1, W, C, 1, W, Co, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1),
                   w=rng.integers(-100, 100, (1, 1, C, Co)).astype(np.int8), bias=rng.integers(-500, 500, Co).astype(np.int32),
                   m0=np.full(Co, 1 << 30, np.int64), shift=np.full(Co, -7, np.int64), x_zero=3, y_zero=-2)

def _cost(tmp_path, lay, cfg, timeout=600):
    for f, t in generate(lay, cfg).items(): (tmp_path / f).write_text(t)
    return hc.cost(tmp_path, timeout=timeout)

def test_same_counts_as_synth_memory_nomap(tmp_path, monkeypatch):
    "On a 2x2 array: cells, flip-flops, multipliers, adders and every memory equal those of synth's own coarse stage."
    lay, cfg = _layer(4, 4, 4), HwConfig(2, 2)     # power-of-two sizes: the address arithmetic has no $mul
    (tmp_path / 'a').mkdir(); (tmp_path / 'b').mkdir()
    ours = _cost(tmp_path / 'a', lay, cfg)
    assert 'memory_share' not in hc._COARSE and 'opt_mem_priority' not in hc._COARSE and 'memory_collect' in hc._COARSE
    monkeypatch.setattr(hc, '_COARSE', hc._COARSE.replace(hc._MEMORY, 'memory -nomap'))
    ref = _cost(tmp_path / 'b', lay, cfg)
    for k in ('cells', 'flip_flops', 'multipliers', 'adders', 'word_cells', 'ram_bits', 'memories'): assert ours[k] == ref[k], k
    # by hand: 2 x 2 PEs, each one 9 x 8-bit product and one requant multiply; the input 4 x 4 bytes
    assert ours['multipliers'] == 2 * 4
    assert {m['name']: m['bits'] for m in ours['memories']}['xmem'] == 4 * 4 * 8
    assert {m['name']: m['write_ports'] for m in ours['memories']}['ymem'] == 4         # one write port per PE

@pytest.mark.slow
@pytest.mark.skipif('slow' not in os.environ.get('NAC_LAB_TEST_FLAGS', '').split(), reason='slow: set NAC_LAB_TEST_FLAGS=slow')
def test_16x16_finishes(tmp_path):
    "A 16 x 16 array (256 PEs, 256 output-buffer write ports): synthesis ends (about 2 minutes on 2 shared cores)."
    k = _cost(tmp_path, _layer(16, 2, 16), HwConfig(16, 16))
    assert k['multipliers'] == 2 * 256
    assert {m['name']: m['write_ports'] for m in k['memories']}['ymem'] == 256
    assert k['cycles'] == 1 * 1 * 1 * 2 + 2                   # one output row, one pixel tile, one channel tile, K = 2
