"`nac-lab hw gen | sim | cost` end to end on a lowered 1x1 conv: files, the printed cycles, the output equal to `nem run`."
import json
import numpy as np, pytest, torch, torch.nn as nn
from nac_lab.cli import main
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.hw.sim import tool_available

@pytest.fixture(scope='module')
def lowered(tmp_path_factory):
    d = tmp_path_factory.mktemp('hwcli')
    torch.manual_seed(3)
    S = (1, 6, 3, 4)
    rng = np.random.default_rng(3)
    low = lower(nac_compile(nn.Sequential(nn.Conv2d(6, 5, 1)).eval(), (torch.zeros(S),)), 'npm_lite', mode='int8',
                calib=[rng.standard_normal(S).astype(np.float32)], tiling=2)
    low.save(d / 'low')
    xq = next(iter(low.quantize_inputs(rng.standard_normal(S).astype(np.float32)).values()))
    np.save(d / 'x.npy', xq)
    return d, xq, next(iter(low.run_raw(xq).values()))

def test_gen_writes_manifest_and_names_bad_layer(lowered, capsys):
    d, _, _ = lowered
    assert main(['hw', 'gen', str(d / 'low'), '--rows', '2', '--cols', '8', '-o', str(d / 'rtl')]) == 0
    m = json.loads((d / 'rtl' / 'manifest.json').read_text())
    assert (m['top'], m['layer'], m['rows'], m['cols'], m['cycles']) == ('hw_L3_conv2d', 'L3_conv2d', 2, 8, 3 * 2 * 1 * 6 + 2)
    assert [p['name'] for p in m['ports']][:3] == ['clk', 'rst', 'start'] and (d / 'rtl' / 'hw_L3_conv2d.v').is_file()
    assert '38 cycles' in capsys.readouterr().out
    assert main(['hw', 'gen', str(d / 'low'), '--layer', 'nope', '-o', str(d / 'rtl2')]) == 1
    assert 'the hardware layers are L3_conv2d' in capsys.readouterr().err

@pytest.mark.skipif(not tool_available('icarus'), reason='Icarus Verilog (iverilog, vvp) not installed: tools/bootstrap.sh --test')
def test_sim_prints_cycles_and_matches_nem_run(lowered, capsys):
    d, xq, ref = lowered
    if not (d / 'rtl').is_dir(): main(['hw', 'gen', str(d / 'low'), '--rows', '2', '--cols', '8', '-o', str(d / 'rtl')])
    capsys.readouterr()
    assert main(['hw', 'sim', str(d / 'rtl'), '--input', str(d / 'x.npy'), '-o', str(d / 'y.npy')]) == 0
    assert 'icarus: 38 cycles' in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(d / 'y.npy').reshape(-1), ref.reshape(-1))

@pytest.mark.skipif(not tool_available('yosys'), reason='yosys not installed: tools/bootstrap.sh --test')
def test_cost_json(lowered, capsys):
    d, _, _ = lowered
    main(['hw', 'gen', str(d / 'low'), '--rows', '1', '--cols', '1', '-o', str(d / 'rtl1')])
    capsys.readouterr()
    assert main(['hw', 'cost', str(d / 'rtl1'), '--json']) == 0
    r = json.loads(capsys.readouterr().out)
    # one PE: its product and the epilogue's 32x32 multiply
    assert r['multipliers'] >= 2 and r['cells'] > r['flip_flops'] > 0
    # the buffers stay memories (not flip-flops): input 3x4x6 bytes written by the host, output 3x4x5 bytes, weights 6x5 bytes (a ROM)
    mem = {m['name']: m for m in r['memories']}
    assert (mem['xmem']['bits'], mem['xmem']['write_ports'], mem['ymem']['bits'], mem['wmem']['bits'], mem['wmem']['rom']) == \
        (8 * 72, 1, 8 * 60, 8 * 30, True)
    assert r['ram_bits'] == sum(m['bits'] for m in r['memories']) >= 8 * (72 + 60 + 30)
    assert r['flip_flops'] < 8 * 72                                  # fewer flip-flops than the input buffer alone has bits

def test_gen_takes_the_array_from_the_device(lowered, capsys, tmp_path):
    d, _, _ = lowered
    # data/nem/devices/npm_lite.nem: NMU int8_macs = 4096 and no declared array shape -> 64 x 64; --cols overrides one side
    assert main(['hw', 'gen', str(d / 'low'), '--device', 'npm_lite', '--cols', '32', '-o', str(tmp_path / 'rtl')]) == 0
    m = json.loads((tmp_path / 'rtl' / 'manifest.json').read_text())
    assert (m['rows'], m['cols'], m['acc_bits']) == (64, 32, 32)
    assert '64x32 array' in capsys.readouterr().out
    # a device whose NMU declares its array (the keys the NEM timed simulator reads) and an L1 too small for this layer's buffers
    dev = tmp_path / 'tiny.nem'
    dev.write_text('include "nem_baseline_1.0.nem"\n\ndevice tiny extends nem_baseline_1_0 {\n    topology {\n        num_engines = 1\n'
                   '        l2_size_bytes = 65536\n        device_units {\n            sDMA = 1\n            WDM = 0\n        }\n'
                   '        per_engine {\n            NMU = 1\n            CSTL = 1\n            DMA = 1\n            VPU = 1\n'
                   '            SEQ = 1\n            l1_size_bytes = 64\n        }\n    }\n    unit_characteristics {\n'
                   '        NMU {\n            int8_macs = 24\n            array_rows = 3\n'
                   '            array_cols = 8\n        }\n    }\n}\n')
    import shutil
    from nac_lab.core import data_path
    shutil.copyfile(data_path('nem', 'nem_baseline_1.0.nem'), tmp_path / 'nem_baseline_1.0.nem')
    from nac_lab.hw.gen import device_config
    assert (device_config(dev).rows, device_config(dev).cols) == (3, 8)
    assert main(['hw', 'gen', str(d / 'low'), '--device', str(dev), '-o', str(tmp_path / 'rtl2')]) == 1
    # the 1x1 conv of the fixture: input 6x3x4 (72 bytes), weights 5x6, output 5x3x4 (60 bytes), 5 channels x 9 table bytes
    assert f'need {72 + 30 + 60 + 45} bytes; one engine of the device has 64 bytes of L1' in capsys.readouterr().err
    assert not (tmp_path / 'rtl2').exists()
