"""Notebooks are the source of truth: `nbdev_export` and `nbdev_clean` must change nothing.

The check runs on a copy of the checkout (tracked and not-ignored files), so it never touches the user's files.
"""
import hashlib, shutil, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _files(root):
    out = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard'], cwd=root, capture_output=True, text=True, check=True)
    return [f for f in out.stdout.splitlines() if (root / f).is_file()]


def _digest(root, files):
    return {f: hashlib.sha256((root / f).read_bytes()).hexdigest() for f in files if (root / f).exists()}


@pytest.fixture(scope='module')
def copy(tmp_path_factory):
    dst = tmp_path_factory.mktemp('sync') / 'repo'
    for f in _files(ROOT):
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dst / f, follow_symlinks=False)
    subprocess.run(['git', 'init', '-q'], cwd=dst, check=True)
    return dst


@pytest.mark.parametrize('tool', ['nbdev_export', 'nbdev_clean'])
def test_tool_changes_nothing(copy, tool):
    files = _files(ROOT)
    assert any(f.endswith('.ipynb') for f in files), 'no notebooks found'
    before = _digest(copy, files)
    res = subprocess.run([str(BIN / tool)], cwd=copy, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    after = _digest(copy, files)
    changed = sorted(f for f in before if before[f] != after.get(f))
    new = sorted(set(_files(copy)) - set(files))
    assert not changed and not [n for n in new if n.startswith(('nac_lab/', 'nbs/'))], \
        f'{tool} would change {changed + new}: run `make export` and commit'


def test_no_notebook_exports_during_the_tests():
    "A cell calling `nbdev_export()` would rewrite `nac_lab/` in place while other test workers import it: it must be `eval: false`."
    import json
    from nac_lab.docs import split_directives
    bad = []
    for nb in sorted((ROOT / 'nbs').glob('*.ipynb')):
        for i, c in enumerate(json.loads(nb.read_text())['cells']):
            src = ''.join(c['source'])
            if c['cell_type'] == 'code' and 'nbdev_export(' in src and split_directives(src)[0].get('eval', '').lower() != 'false':
                bad.append(f'{nb.name} cell {i}')
    assert not bad, bad
