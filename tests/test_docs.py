"""The documentation site builds offline and renders in a real browser; the README matches its notebook."""
import re, shutil, subprocess
from pathlib import Path
import pytest
from nac_lab.core import repo_root
from nac_lab.docs import build_docs, readme_text

ROOT = repo_root()
CHROMIUM = shutil.which('chromium') or shutil.which('chromium-browser') or shutil.which('google-chrome')


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    return build_docs(out=tmp_path_factory.mktemp('docs') / '_docs')


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
