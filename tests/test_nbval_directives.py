"""conftest.py makes nbval honour nbdev's conventions; check each on a throw-away notebook."""
import shutil, subprocess, sys
from pathlib import Path
import nbformat
from nbformat.v4 import new_notebook, new_code_cell

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, cells, env_flags=''):
    nb = new_notebook(cells=cells, metadata={'kernelspec': {'name': 'python3', 'display_name': 'python3', 'language': 'python'}})
    proj = tmp_path / 'proj'
    proj.mkdir()
    for f in ('conftest.py', 'settings.ini', 'pyproject.toml'): shutil.copy(ROOT / f, proj / f)
    (proj / 'tools').mkdir(); shutil.copy(ROOT / 'tools' / 'nbval_sanitize.cfg', proj / 'tools')
    nbformat.write(nb, proj / 'demo.ipynb')
    env = {'NAC_LAB_TEST_FLAGS': env_flags, 'PATH': str(Path(sys.executable).parent) + ':/usr/bin:/bin', 'HOME': str(tmp_path)}
    res = subprocess.run([sys.executable, '-m', 'pytest', '-p', 'no:xdist', '-q', '-rs', 'demo.ipynb'], cwd=proj,
                         capture_output=True, text=True, env=env, timeout=300)
    return res.returncode, res.stdout + res.stderr


def _cleaned(src, text):
    "A cell as nbdev_clean leaves it: outputs kept, execution count removed."
    c = new_code_cell(src)
    c.outputs = [nbformat.v4.new_output('stream', name='stdout', text=text)]
    c.execution_count = None
    return c


def test_eval_false_and_flags_are_skipped(tmp_path):
    rc, out = _run(tmp_path, [new_code_cell('#| eval: false\nraise SystemExit("must not run")'),
                              new_code_cell('#| slow\nraise RuntimeError("slow cell ran")'),
                              new_code_cell('x = 1')])
    assert rc == 0, out
    assert '1 passed, 2 skipped' in out and 'eval: false' in out and 'NAC_LAB_TEST_FLAGS=slow' in out


def test_flagged_cell_runs_when_enabled(tmp_path):
    rc, out = _run(tmp_path, [new_code_cell('#| slow\nraise RuntimeError("slow cell ran")')], env_flags='slow')
    assert rc == 1 and 'slow cell ran' in out


def test_cleaned_outputs_are_compared(tmp_path):
    rc, out = _run(tmp_path, [_cleaned('print(6*7)', '42\n')])
    assert rc == 0 and '1 passed' in out, out
    (tmp_path / 'wrong').mkdir()
    rc, out = _run(tmp_path / 'wrong', [_cleaned('print(6*7)', '41\n')])
    assert rc == 1 and 'Cell outputs differ' in out, out


def test_stored_outputs_do_not_depend_on_the_machine():
    """nbval compares every stored output of a cell not marked `# NBVAL_IGNORE_OUTPUT`, stderr included: a warning
    that quotes the checkout's path or site-packages (an import-time warning of a dependency) passes here and fails on a
    clean clone elsewhere. Such outputs must not be stored, and warnings do not belong in compared outputs at all."""
    bad = []
    for path in sorted((ROOT / 'nbs').glob('*.ipynb')):
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type != 'code' or _ignores_output(cell.source): continue
            for out in cell.get('outputs', []):
                text = str(out.get('text', '')) + str(out.get('data', {}).get('text/plain', ''))
                if out.get('name') == 'stderr' or str(ROOT) in text or 'site-packages' in text:
                    bad.append(f'{path.name} cell {i}: {text[:80]!r}')
    assert not bad, 'machine-dependent stored outputs:\n' + '\n'.join(bad)


def _ignores_output(source: str) -> bool:
    "nbval's own rule: a comment line that is exactly `# NBVAL_IGNORE_OUTPUT` (any text after it and the marker is not seen)."
    return any(l.strip().startswith('#') and l.strip().lstrip('#').strip() == 'NBVAL_IGNORE_OUTPUT' for l in source.splitlines())


def test_nbval_markers_are_exact():
    """A line such as `# NBVAL_IGNORE_OUTPUT: why` looks like the marker but nbval ignores it and compares the outputs: every
    comment that mentions a marker must be the marker alone (the reason goes on the next line)."""
    bad = [f'{p.name} cell {i}: {l.strip()!r}' for p in sorted((ROOT / 'nbs').glob('*.ipynb'))
           for i, c in enumerate(nbformat.read(p, as_version=4).cells) if c.cell_type == 'code'
           for l in c.source.splitlines() if l.strip().startswith('#') and 'NBVAL_' in l and l.strip().lstrip('#').strip() not in
           ('NBVAL_IGNORE_OUTPUT', 'NBVAL_SKIP', 'NBVAL_CHECK_OUTPUT', 'NBVAL_RAISES_EXCEPTION')]
    assert not bad, 'inexact nbval markers:\n' + '\n'.join(bad)
    assert _ignores_output('x = 1\n# NBVAL_IGNORE_OUTPUT\n') and not _ignores_output('# NBVAL_IGNORE_OUTPUT: why\n')
