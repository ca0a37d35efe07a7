"""The documentation site builds offline, writes nothing outside its output folder, and renders in a real browser; the README matches its notebook."""
import os, re, shutil, subprocess, sys
from pathlib import Path
import pytest
from nac_lab.core import repo_root
from nac_lab.docs import build_docs, readme_text

ROOT = repo_root()
CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser') or shutil.which('google-chrome')


# `nac-lab docs -o DIR` runs in a child process with an audit hook that logs every file or folder the
# process opens for writing, creates, renames onto, changes or removes (Python's audit events cover
# every write made through Python, wherever it is), with HOME and TMPDIR in fresh folders and no
# bytecode writing. The test then lists every touched path outside DIR.
_HOOKED_CLI = r"""
import os, sys
_log = open(os.environ['NAC_LAB_TOUCH_LOG'], 'w', buffering=1)
_W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
# event -> (path argument, its dir_fd argument) for every event that changes the file system
_EVENTS = {'os.mkdir': [(0, 2)], 'os.remove': [(0, 1)], 'os.rmdir': [(0, 1)], 'os.chmod': [(0, 2)], 'os.chown': [(0, 3)],
           'os.truncate': [(0, None)], 'os.utime': [(0, 3)], 'os.rename': [(0, 2), (1, 3)], 'os.replace': [(0, 2), (1, 3)],
           'os.link': [(1, 3)], 'os.symlink': [(1, 2)], 'shutil.rmtree': [(0, 1)]}
def _note(ev, p, dir_fd=None):
    if not isinstance(p, (str, bytes, os.PathLike)): return
    p = os.fsdecode(p)
    base = os.readlink(f'/proc/self/fd/{dir_fd}') if isinstance(dir_fd, int) and dir_fd >= 0 else os.getcwd()
    _log.write(ev + ' ' + os.path.normpath(os.path.join(base, p)) + '\n')
def _hook(ev, args):
    if ev == 'open':
        path, mode, flags = args
        if (isinstance(mode, str) and any(c in mode for c in 'wax+')) or (mode is None and isinstance(flags, int) and flags & _W):
            _note(ev, path)
    for i, j in _EVENTS.get(ev, ()):
        _note(ev, args[i], args[j] if j is not None and j < len(args) else None)
sys.addaudithook(_hook)
from nac_lab.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _inside(p: Path, folder: Path) -> bool:
    return p == folder or folder in p.parents


def _tree(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob('*'))


@pytest.fixture(scope='module')
def built(tmp_path_factory):
    "Build the whole site with `nac-lab docs -o DIR` from inside the checkout; returns `(DIR, touched paths, sandbox)`."
    box = tmp_path_factory.mktemp('sandbox')
    home, tmp, log, out = box / 'home', box / 'tmp', box / 'touched.log', box / 'out' / 'site' / '_docs'
    home.mkdir(); tmp.mkdir()
    env = {**os.environ, 'HOME': str(home), 'TMPDIR': str(tmp), 'PYTHONDONTWRITEBYTECODE': '1', 'NAC_LAB_TOUCH_LOG': str(log),
           'PYTHONPATH': str(ROOT)}
    res = subprocess.run([sys.executable, '-c', _HOOKED_CLI, 'docs', '-o', str(out)], cwd=ROOT / 'nbs', env=env,
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert f'site written: {out}/index.html' in res.stdout and 'README' not in res.stdout, res.stdout
    assert res.stderr.strip() == '' or 'docs: [' not in res.stderr, 'progress lines are for terminals only'
    touched = sorted({(l.split(' ', 1)[0], Path(l.split(' ', 1)[1])) for l in log.read_text().splitlines()})
    return out, touched, dict(home=home, tmp=tmp)


@pytest.fixture(scope='module')
def site(built):
    return built[0]


def test_nothing_written_outside_the_output_folder(built):
    out, touched, box = built
    assert touched, 'the audit hook saw no write at all: the check itself is broken'
    assert any(_inside(p, out) for _, p in touched)
    # allowed: DIR itself and its missing parents (`mkdir -p DIR`), anything in DIR, the temporary folder
    outside = [(ev, str(p)) for ev, p in touched if not _inside(p, out) and not _inside(p, box['tmp'])
               and not (ev == 'os.mkdir' and p in out.parents)]
    assert outside == [], f'written outside {out}: {outside[:20]}'
    assert not any(_inside(p, ROOT) for _, p in touched), 'the build wrote into the checkout (README.md, _proc/ ...)'
    assert _tree(box['tmp']) == [], 'temporary files left behind'
    assert _tree(box['home']) == [], 'files written into HOME'
    assert _tree(out.parent.parent) == ['site', 'site/_docs'] + [f'site/_docs/{p}' for p in _tree(out)]
    assert all(p.suffix == '.html' for p in out.iterdir())


def test_pages_follow_the_umask(built):
    mask = os.umask(0o022); os.umask(mask)
    for p in built[0].iterdir(): assert p.stat().st_mode & 0o777 == 0o666 & ~mask, p


def test_refuses_outside_a_checkout(tmp_path):
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'PYTHONDONTWRITEBYTECODE': '1'}
    res = subprocess.run([sys.executable, '-c', 'import sys; from nac_lab.cli import main; sys.exit(main(sys.argv[1:]))', 'docs', '-o', str(tmp_path / 'site')], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and 'not inside a nac_lab source checkout' in res.stderr, res.stderr
    assert _tree(tmp_path) == []


def _page_name(nb: Path) -> str:
    return 'index.html' if nb.stem == 'index' else re.sub(r'^\d+[a-z]?_', '', nb.stem) + '.html'


def test_one_page_per_notebook(site):
    nbs = sorted((ROOT / 'nbs').glob('*.ipynb'))
    assert len(nbs) >= 5
    want = {_page_name(nb) for nb in nbs}
    got = {p.name for p in site.glob('*.html')}
    assert want <= got, f'missing pages: {sorted(want - got)}'
    for name in want:
        page = (site / name).read_text()
        assert 'class="nl-side"' in page and page.count('<a href=') >= len(want), name
        assert 'https://cdnjs' not in page, f'{name} would fetch scripts from a CDN'


def _dom(url: str, tmp_path) -> str:
    cmd = [CHROMIUM, '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync',
           f'--user-data-dir={tmp_path / "profile"}', '--virtual-time-budget=3000', '--dump-dom', url]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


@pytest.mark.skipif(CHROMIUM is None, reason='Chromium is not installed (Debian package `chromium`); `make test` installs it')
def test_site_renders_in_chromium(site, tmp_path):
    dom = _dom((site / 'index.html').as_uri(), tmp_path)
    assert re.search(r'<title>nac_lab</title>', dom)
    assert '<h1 class="nl-title">nac_lab</h1>' in dom
    assert re.search(r'<svg[^>]*>.*?<title>nac_lab</title>', dom, re.S), 'pipeline graph not rendered as SVG'
    dom = _dom((site / 'binio.html').as_uri(), tmp_path)
    assert '<title>binio</title>' in dom and 'Reader' in dom and 'nl-here' in dom


def test_readme_matches_index_notebook():
    assert (ROOT / 'README.md').read_text() == readme_text(ROOT), 'README.md is stale: run `make export`'
