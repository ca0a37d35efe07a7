"""RTL check: the Verilog that `nac-lab fxp rtl` generates, simulated with Icarus Verilog on >= 10,000 random tiles
(with edge values), must agree bit for bit with the Python model (nac_lab.fxp.mac.Datapath), and take exactly the
cycles the model's cycle count says. Each simulation is compiled once and runs under a time limit."""
import shutil, subprocess
import numpy as np
import pytest
from nac_lab.fxp.rtl import RtlConfig, random_layers, model_outputs, simulate, iverilog_available, verilog_mac_array, SimError

pytestmark = pytest.mark.skipif(not iverilog_available(), reason='iverilog is not installed and could not be installed: '
                                'run `bash tools/bootstrap.sh --test` (Debian package iverilog) to enable the RTL check')

CONFIGS = [RtlConfig(rows=2, cols=3, in_bits=8, acc_bits=32, overflow='wrap', rounding='double'),
           RtlConfig(rows=3, cols=2, in_bits=8, acc_bits=16, overflow='sat', rounding='single')]


@pytest.mark.parametrize('cfg', CONFIGS, ids=lambda c: f'{c.rows}x{c.cols}-acc{c.acc_bits}-{c.overflow}-{c.rounding}')
def test_rtl_matches_model(cfg):
    rng = np.random.default_rng(cfg.acc_bits)
    layers = random_layers(cfg, 1500, rng)
    tiles = sum(len(l.tiles(cfg)) for l in layers)
    assert tiles >= 5000                     # two configurations: >= 10,000 tiles (>= 30,000 input cycles) in all
    steps = sum(len(l.tiles(cfg)) * l.x.shape[1] for l in layers)
    want = model_outputs(cfg, layers)
    got, cycles = simulate(cfg, layers, timeout=240)
    bad = [(k, np.argwhere(g != w)[0].tolist()) for k, (g, w) in enumerate(zip(got, want)) if (g != w).any()]
    assert not bad, f'{len(bad)} layers differ; first: layer {bad[0][0]} at {bad[0][1]}'
    # the array's cycle count: tiles back to back, K cycles each, + pipeline depth 1 (Datapath.cycles)
    assert cycles == steps + 1
    dps = [cfg.datapath(multiplier=(l.m0, l.shift)) for l in layers]
    assert sum(dp.cycles(l.x.shape[0], l.x.shape[1], l.w.shape[1]) - dp.pipeline_depth for dp, l in zip(dps, layers)) + 1 == cycles
    # the vectors exercised overflow: accumulator saturations/wraps happened
    ev = sum(cfg.datapath(x_zero=l.x_zero, w_zero=l.w_zero, multiplier=(l.m0, l.shift)).run(l.x, l.w,
                                                                                            l.bias).n_events for l in layers[:300])
    assert ev > 0
    # sensitivity: models with the other accumulator overflow (and, for single rounding, the other rounding) disagree
    flip = RtlConfig(**{**cfg.__dict__, 'overflow': 'sat' if cfg.overflow == 'WRAP' else 'wrap'})
    assert any((g != w).any() for g, w in zip(got[:300], model_outputs(flip, layers[:300])))
    if cfg.rounding == 'single':
        dbl = RtlConfig(**{**cfg.__dict__, 'rounding': 'double'})
        assert any((g != w).any() for g, w in zip(got[:300], model_outputs(dbl, layers[:300])))


def test_compile_error_is_reported(tmp_path):
    cfg = CONFIGS[0]
    layers = random_layers(cfg, 1, np.random.default_rng(0))
    import nac_lab.fxp.rtl as rtl
    orig = rtl.verilog_mac_array
    try:
        rtl.verilog_mac_array = lambda c: 'module broken(;'
        with pytest.raises(SimError, match='iverilog compile failed'): simulate(cfg, layers, timeout=60)
    finally: rtl.verilog_mac_array = orig


@pytest.mark.skipif(shutil.which('yosys') is None, reason='yosys (optional) is not installed')
def test_yosys_reads_and_elaborates(tmp_path):
    (tmp_path / 'mac.v').write_text(verilog_mac_array(RtlConfig(rows=1, cols=2, acc_bits=24, overflow='sat')))
    r = subprocess.run(['yosys', '-q', '-p', 'read_verilog mac.v; hierarchy -check -top nac_mac_array; proc; check -assert'],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_cli_rtl_verify(tmp_path):
    from nac_lab.cli import run_cli
    rc, out, err = run_cli('fxp', 'rtl', '--rows', '2', '--cols', '2', '--acc-bits', '18', '--overflow', 'sat',
                           '--rounding', 'single', '--verify', '40', '-o', tmp_path / 'mac.v')
    assert rc == 0, err
    assert 'iverilog:' in out and ' 0 output(s) differ from the model' in out
    assert (tmp_path / 'mac.v').read_text().count('\nmodule ') == 4
