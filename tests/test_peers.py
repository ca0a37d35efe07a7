"""A deterministic, fast sample of the peer benchmark (`nac_lab.bench.peers`): one model per family at small inputs.

The full run (every torchvision classification model, the timm and transformers lists, lowering included) is the benchmark
`python -m nac_lab.bench.peers`; here each sampled model must compile and run within 1e-4 relative of eager, and the table
and command line must say so.
"""
import csv
import pytest

from nac_lab.bench import peers

try: peers.import_torchvision()      # before timm, which imports torchvision (see the notebook 21b_bench_peers)
except ImportError: pytest.skip('torchvision is not installed', allow_module_level=True)
pytest.importorskip('timm')
pytest.importorskip('transformers')

SAMPLE = [('torchvision', 'squeezenet1_1'),       # plain convnet, ceil-mode pooling, concat
          ('torchvision', 'mobilenet_v3_small'),  # depthwise, hardswish, squeeze-excitation
          ('torchvision', 'swin_t'),              # window attention; its mask is a slice assignment of a 0-d constant (#28 item 3)
          ('timm', 'lcnet_050'),
          ('timm', 'vit_tiny_patch16_224'),       # at 32x32: 4 patches
          ('transformers', 'gpt2'),               # decoder
          ('transformers', 't5')]                 # encoder-decoder, two inputs

@pytest.mark.parametrize('suite,name', SAMPLE)
def test_compiles_and_runs(suite, name):
    r = peers.bench_model(suite, name, lowering=False)
    assert (r['compiled'], r['ran'], r['error']) == (True, True, ''), r['error']
    assert 0 <= r['rel_err'] <= 1e-4
    assert r['params'] > 0 and r['lowered_float'] == ''      # lowering not asked for: its columns stay empty

def test_lowering_columns_filled():
    "BERT through every stage: each lowering column is either filled or its failure is named in the error text."
    r = peers.bench_model('transformers', 'bert')
    assert r['compiled'] is True and r['ran'] is True
    for k in ('float', 'int8'):
        assert r[f'lowered_{k}'] in (True, False)
        if r[f'lowered_{k}'] is False: assert f'lower {k}:' in r['error']
        elif r[f'check_{k}'] == 0:
            assert r[f'exec_{k}'] is True or f'execute {k}:' in r['error']
            assert isinstance(r[f'cycles_{k}'], int) and r[f'cycles_{k}'] > 0
    if r['exec_int8'] is True: assert 0 <= r['int8_top1'] <= 1

def test_cli_writes_table(tmp_path, capsys):
    peers.main(['--suite', 'transformers', '--only', 'bert', '--no-lower', '-o', str(tmp_path)])
    rows = list(csv.DictReader((tmp_path / 'peers.csv').open()))
    assert [(r['suite'], r['model'], r['compiled'], r['ran']) for r in rows] == [('transformers', 'bert', 'yes', 'yes')]
    assert (tmp_path / 'peers.md').read_text().startswith('| suite | model |')
    assert 'transformers: 1 models: compiled 1, ran within 0.0001 1' in capsys.readouterr().out

def test_cli_unknown_model(tmp_path, capsys):
    with pytest.raises(SystemExit) as e: peers.main(['--suite', 'timm', '--only', 'no_such_net', '-o', str(tmp_path)])
    assert e.value.code == 2 and 'unknown model(s): no_such_net' in capsys.readouterr().err
    assert not (tmp_path / 'peers.csv').exists()
