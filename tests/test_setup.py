"""What the README's setup promises: the CPU build of torch, JupyterLab for the notebooks, Graphviz's `dot`."""
import shutil, subprocess, sys
from pathlib import Path

BIN = Path(sys.executable).parent

def test_torch_is_the_pinned_cpu_build():
    import torch
    assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__
    assert torch.version.cuda is None, f'a CUDA build of torch was installed ({torch.version.cuda})'

def test_jupyterlab_is_installed():
    r = subprocess.run([str(BIN / 'jupyter'), 'lab', '--version'], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip().split('.')[0]) >= 4, r.stdout

def test_graphviz_dot_is_installed():
    assert shutil.which('dot'), 'Graphviz `dot` is missing: run tools/bootstrap.sh'
