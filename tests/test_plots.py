"""Plots that explain (issue 33 item 7): the Gantt chart and the roofline of a lowered zoo model are titled with the model's
name, the roofline draws min(bandwidth x intensity, peak) with every layer under it, and `nem sim` prints only the units that
did work (`--all-units` adds the idle ones) and says where `--gantt` wrote its chart. The Pareto plot is tested in
nbs/69c_lower_dse.ipynb (it needs a Dask sweep)."""
import re
import numpy as np
import pytest
import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from nac_lab.cli import run_cli  # noqa: E402


@pytest.fixture(scope='module')
def lowered(tmp_path_factory):
    "cnn from the zoo, compiled to `cnn.nac`, lowered to npm_lite (int8, two seeded calibration samples) and saved; `(Lowered, folder)`."
    import torch
    from nac_lab.nac.compiler.compile import compile as nac_compile
    from nac_lab.nac import zoo
    from nac_lab.lower.api import lower
    d = tmp_path_factory.mktemp('plots')
    nac_compile(zoo.build_model('cnn'), (torch.zeros(1, 3, 32, 32),)).save(d / 'cnn.nac')
    rng = np.random.default_rng(0)
    low = lower(d / 'cnn.nac', 'npm_lite', calib=[rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(2)],
                fuse=False)      # every layer its own point (fused, a ReLU runs inside its conv's band)
    return low, low.save(d / 'cnn_npm_lite')


def test_program_and_gantt_named_after_the_model(lowered):
    from nac_lab.nem.timing.sim import gantt
    low, _ = lowered
    assert 'program cnn:' in low.program and 'program lowered' not in low.program
    ax = gantt(low.simulate())
    assert ax.get_title() == 'cnn on npm_lite'
    assert ax.get_xlabel().startswith('cycles (') and ' MHz)' in ax.get_xlabel()
    plt.close(ax.figure)


def test_roofline_points_under_the_roof(lowered):
    from nac_lab.nem.timing.sim import roofline_plot, layer_points, roofs
    res = lowered[0].simulate()
    bw, peak = roofs(res)
    assert (bw, peak) == (64 * 3, {'NMU': 4096, 'CSTL/VPU': 64 * 2 + 16})   # npm_lite: 2 DMA + 1 sDMA; 1 NMU; 2 CSTL + 1 VPU
    pts = layer_points(res)
    assert {p['layer'] for p in pts} == {'L3', 'L4', 'L5', 'L8', 'L9', 'L10', 'L14'}       # conv, relu, pool, conv, relu, pool, linear
    assert {p['layer']: p['unit'] for p in pts}['L3'] == 'NMU' and {p['layer']: p['unit'] for p in pts}['L4'] == 'CSTL/VPU'
    for p in pts: assert 0 < p['per_cycle'] <= min(bw * p['intensity'], peak[p['unit']]), p
    ax = roofline_plot(res)
    assert ax.get_title() == 'roofline: cnn on npm_lite'
    assert 'per byte' in ax.get_xlabel() and 'per cycle' in ax.get_ylabel()
    roof = {l.get_label().split(' roof')[0]: l for l in ax.lines if ' roof: ' in l.get_label()}
    assert set(roof) == {'NMU', 'CSTL/VPU'}
    for unit, line in roof.items():
        x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
        assert np.array_equal(y, np.minimum(bw * x, peak[unit]))       # the roof bends where bandwidth meets the peak
        assert y.max() == peak[unit] and y.min() < peak[unit]
    marks = {l.get_label(): l.get_marker() for l in ax.lines if l.get_linestyle() == 'None'}
    assert marks == {'NMU layers': 'o', 'CSTL/VPU layers': 's'}
    plt.close(ax.figure)


def _unit_rows(out: str) -> list:
    lines = out.splitlines()
    i = lines.index('units (busy cycles, busy fraction):')
    return [l.split()[0] for l in lines[i + 1:] if re.match(r'  \S+\s+\d+\s+[\d.]+%$', l)]


def test_nem_sim_prints_busy_units_and_where_the_gantt_went(lowered, tmp_path):
    low, folder = lowered
    from nac_lab.nem.timing.sim import summary
    busy = [u for u, d in summary(low.simulate())['units'].items() if d['busy']]
    idle = [u for u, d in summary(low.simulate())['units'].items() if not d['busy']]
    assert busy and idle
    g = tmp_path / 'g.png'
    rc, out, err = run_cli('nem', 'sim', folder / 'model.nem', '--gantt', g)
    assert rc == 0, err
    assert _unit_rows(out) == busy                                    # only the units that did work ...
    assert f'  ({len(idle)} idle units not shown; --all-units lists them)' in out
    assert out.rstrip().endswith(f'Gantt chart written to {g}') and g.read_bytes()[:4] == b'\x89PNG'
    rc, out, err = run_cli('nem', 'sim', folder / 'model.nem', '--all-units')
    assert rc == 0, err
    assert sorted(_unit_rows(out)) == sorted(busy + idle), out           # ... the idle ones on request
    assert 'idle units not shown' not in out and 'Gantt' not in out
