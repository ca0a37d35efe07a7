"""Files the command line writes follow the user's umask and replace their target atomically (nac_lab.fileio)."""
import os, stat
import numpy as np
import pytest
import torch
from nac_lab.cli import run_cli
from nac_lab.fileio import new_file_mode
import nac_lab

@pytest.fixture(scope='module')
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp('out')
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    nac_lab.compile(m, (torch.randn(2, 4),)).save(d / 'm.nac')
    np.save(d / 'x.npy', np.ones((2, 4), np.float32))
    return d

def _mode(p): return stat.S_IMODE(os.stat(p).st_mode)

def test_run_output_and_graph_follow_the_umask(model):
    d = model
    rc, out, err = run_cli('run', d / 'm.nac', '--input', f'input={d / "x.npy"}', '--output', d / 'y.npz')
    assert rc == 0, err
    assert _mode(d / 'y.npz') == new_file_mode() and np.load(d / 'y.npz')['output0'].shape == (2, 3)
    rc, out, err = run_cli('graph', d / 'm.nac', '-o', d / 'g.svg')
    assert rc == 0, err
    assert _mode(d / 'g.svg') == new_file_mode() and (d / 'g.svg').read_bytes().lstrip().startswith(b'<')
    assert not [p.name for p in d.iterdir() if p.name.endswith('.tmp')]

def test_run_output_through_a_symlink_is_refused(model):
    d = model
    (d / 'keep.npz').write_bytes(b'precious')
    os.symlink(d / 'keep.npz', d / 'link.npz')
    rc, out, err = run_cli('run', d / 'm.nac', '--input', f'input={d / "x.npy"}', '--output', d / 'link.npz')
    assert rc == 1 and 'symbolic link' in err, err
    assert (d / 'keep.npz').read_bytes() == b'precious'
