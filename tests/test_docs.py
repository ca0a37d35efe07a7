"""The documentation site builds offline, writes nothing outside its output folder, and renders in a real browser; the
README matches its notebook."""
import os, re, subprocess, sys
from pathlib import Path
import pytest
from nac_lab.core import repo_root
from nac_lab.docs import readme_text
from cdp import CHROMIUM                    # the one lookup of the browser (tests/cdp.py)

ROOT = repo_root()


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
    assert {p.name for p in out.iterdir() if p.suffix != '.html'} == {'search.js', 'search_index.js', '.nl-build'}


def test_pages_follow_the_umask(built):
    mask = os.umask(0o022); os.umask(mask)
    for p in [*built[0].iterdir(), *(built[0] / '.nl-build').iterdir()]:
        if p.is_file(): assert p.stat().st_mode & 0o777 == 0o666 & ~mask, p


def test_refuses_outside_a_checkout(tmp_path):
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'PYTHONDONTWRITEBYTECODE': '1'}
    res = subprocess.run([sys.executable, '-c', 'import sys; from nac_lab.cli import main; sys.exit(main(sys.argv[1:]))', 'docs', '-o',
                          str(tmp_path / 'site')], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 1 and 'not inside a nac_lab source checkout' in res.stderr, res.stderr
    assert _tree(tmp_path) == []


def _page_name(nb: Path) -> str:
    return 'index.html' if nb.stem == 'index' else re.sub(r'^\d+[a-z]?_', '', nb.stem) + '.html'


def test_one_page_per_notebook(site):
    nbs = sorted((ROOT / 'nbs').glob('*.ipynb'))
    pages = {_page_name(nb) for nb in nbs}
    assert len(pages) == len(nbs), 'two notebooks would share one page'
    want = pages | {'api_index.html'}
    got = {p.name for p in site.glob('*.html')}
    assert got == want, f'missing pages: {sorted(want - got)}, pages of no notebook: {sorted(got - want)}'
    for name in want:
        page = (site / name).read_text()
        assert 'class="nl-side"' in page and page.count('<a href=') >= len(want), name
        assert 'https://cdnjs' not in page, f'{name} would fetch scripts from a CDN'


def _dom(url: str, tmp_path) -> str:
    "The DOM of `url` after its scripts ran, as headless Chromium sees it (no network)." 
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


def test_prev_next_links_and_narrow_layout(site):
    "Every page links to its neighbours in sidebar order, and carries the viewport and the narrow-screen (400 px) rules."
    home, binio = (site / 'index.html').read_text(), (site / 'binio.html').read_text()
    assert 'rel="prev"' not in home and 'rel="next" href="api_index.html"' in home
    assert 'rel="next" href="errors.html"' in binio and 'rel="prev" href="api_index.html"' in binio   # 00_binio, then 00a_errors
    for page in site.glob('*.html'):
        text = page.read_text()
        pager = text.count('<nav class="nl-pager" aria-label=')          # the element, not code quoting it
        assert pager == 1 and 'name="viewport"' in text, page.name
        narrow = text[text.index('@media (max-width: 40rem)'):]
        assert re.match(r'@media \(max-width: 40rem\) \{\s*\.nl-side \{ position: static;', narrow), page.name


def test_readme_matches_index_notebook():
    assert (ROOT / 'README.md').read_text() == readme_text(ROOT), 'README.md is stale: run `make export`'


def _nb_number(name: str):
    m = re.match(r'(\d+)', name)
    return int(m.group(1)) if m else None


def test_sidebar_grouped_by_area(site):
    "Every numbered notebook sits under the area its number falls in (ranges of issue #20), sorted by file name."
    ranges = [(0, 7, 'Foundation'), (10, 14, 'NAC container'), (15, 24, 'NAC compiler and runtime'), (25, 28, 'MMAP'),
              (30, 39, 'NEM'), (40, 46, 'Trillim'), (50, 58, 'IR v2'), (59, 65, 'Fixed point'), (66, 69, 'Lowering'),
              (70, 75, 'ARK')]
    side = (site / 'binio.html').read_text()
    side = side[side.index('<nav class="nl-side"'):]
    side = side[:side.index('</nav>')]
    groups, order = {}, re.findall(r'<div class="nl-group">([^<]+)</div>|<a href="([^"]+)"', side)
    area = None
    for g, href in order:
        if g: area = g; continue
        groups.setdefault(area, []).append(href)
    for nb in sorted((ROOT / 'nbs').glob('[0-9]*.ipynb')):
        n = _nb_number(nb.name)
        want = next((a for lo, hi, a in ranges if lo <= n <= hi), None)
        if want: assert _page_name(nb) in groups.get(want, []), (nb.name, want)
    for area, hrefs in groups.items():
        if area is None: continue
        names = [next(nb.name for nb in (ROOT / 'nbs').glob('*.ipynb') if _page_name(nb) == h) for h in hrefs]
        assert names == sorted(names), area


def test_code_hides_directives_and_nbval_markers(site):
    for p in site.glob('*.html'):
        code = ''.join(re.findall(r'<div class="highlight[^"]*"><pre>(.*?)</pre>', p.read_text(), re.S))
        text = re.sub(r'<[^>]+>', '', code)
        assert not re.search(r'^\s*#\|', text, re.M) and not re.search(r'^\s*#\s*NBVAL_', text, re.M), p.name


def test_api_index_lists_every_public_name(site):
    import ast
    page = (site / 'api_index.html').read_text()
    for f in sorted((ROOT / 'nac_lab').rglob('*.py')):
        rel = f.relative_to(ROOT).with_suffix('')
        if any(x.startswith('_') and x != '__init__' for x in rel.parts): continue
        tree = ast.parse(f.read_text())
        names = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                      and any(getattr(t, 'id', None) == '__all__' for t in n.targets)), [])
        mod = '.'.join(rel.parts).removesuffix('.__init__')
        if names: assert f'id="{mod}"' in page, mod
        for name in names: assert f'<code>{name}</code>' in page, (mod, name)


@pytest.mark.skipif(CHROMIUM is None, reason='Chromium is not installed')
def test_search_finds_a_symbol_in_chromium(site, tmp_path):
    "Opening a page with ?q= types the query into the search box (an input event); the results link to the symbol."
    dom = _dom((site / 'index.html').as_uri() + '?q=SysOp', tmp_path)
    res = re.search(r'<div id="nl-results"[^>]*>(.*?)</div>\s*<a href="index.html"', dom, re.S)
    assert res, 'no results box'
    assert 'href="nac_container.html#SysOp"' in res.group(1), res.group(1)[:2000]
    dom = _dom((site / 'index.html').as_uri() + '?q=zzqqxx%20nothing', tmp_path)
    assert 'No results for' in dom


@pytest.mark.skipif(CHROMIUM is None, reason='Chromium is not installed')
def test_enum_page_and_toc_in_chromium(site, tmp_path):
    from nac_lab.nac.format.container import SysOp
    dom = _dom((site / 'nac_container.html').as_uri(), tmp_path)
    toc = re.search(r'<nav class="nl-toc"[^>]*>(.*?)</nav>', dom, re.S)
    assert toc, 'no table of contents'
    heads = re.findall(r'<h([23]) id="([^"]+)"', dom)
    assert heads and re.findall(r'href="#([^"]+)"', toc.group(1)) == [i for _, i in heads]
    sec = dom[dom.index('<h3 id="SysOp">'):]
    sec = sec[:sec.index('<h3 ', 10)]
    text = re.sub(r'<[^>]+>', '', sec)
    assert 'SysOp(*args' not in text and 'class SysOp(IntEnum):' in text, text[:500]
    for m in SysOp:
        assert re.search(rf'<td><code>{m.name}</code></td>\s*<td><code>{int(m)}</code></td>', sec), m.name
    assert 'object at 0x' not in dom
    # a dataclass shows its fields with their types and defaults, an enum default as Enum.NAME
    import dataclasses
    from nac_lab.nac.format import DataTensor
    sec = dom[dom.index('<h3 id="DataTensor">'):]
    text = re.sub(r'<[^>]+>', '', sec[:sec.index('<h3 ', 10)])
    assert '@dataclass' in text and 'class DataTensor:' in text, text[:500]
    for f in dataclasses.fields(DataTensor): assert re.search(rf'^\s*{f.name}: ', text, re.M), f.name
    assert 'quant: QuantMethod = QuantMethod.NONE' in text
    # the description's inline markdown is rendered, and the page links to its notebook
    desc = re.search(r'<p class="nl-desc">(.*?)</p>', dom, re.S).group(1)
    assert '`' not in desc and '<code>' in desc, desc
    # settings.ini's git_url is a placeholder (example.invalid): no Source link rather than one that leads nowhere
    assert 'class="nl-src"' not in dom


# --- Quarto (`nbdev_docs`, where Quarto is installed): _quarto.yml's sidebar ---------------------------------
# Quarto cannot run here, so the sidebar is checked against Quarto's documented schema for it (quarto-cli,
# src/resources/schema/definitions.yml: the `sidebar` property of `base-website` and the definitions it uses),
# restated as JSON Schema. In words: `contents` is a string, an `{auto: …}` object or a list whose items are a
# path, a navigation item (a closed object of string fields such as `href` and `text`, with an optional `menu`
# of further items), a section (a closed object of `section` — a title or null — and `contents`, recursively)
# or an `{auto: …}` object; a sidebar's `style` is `docked` or `floating`. Objects are closed here even where
# Quarto's schema leaves the sidebar object open, so that a misspelt key fails the test.
_STR = {'type': 'string'}
QUARTO_SIDEBAR = {
    '$defs': {
        'navigation-item': {'anyOf': [_STR, {'$ref': '#/$defs/navigation-item-object'}]},
        'navigation-item-object': {'type': 'object', 'additionalProperties': False, 'properties': {
            **{k: _STR for k in ('aria-label', 'file', 'href', 'icon', 'id', 'text', 'url', 'rel', 'target')},
            'menu': {'type': 'array', 'items': {'$ref': '#/$defs/navigation-item'}}}},
        'contents-auto': {'type': 'object', 'additionalProperties': False, 'required': ['auto'], 'properties': {
            'auto': {'anyOf': [{'type': 'boolean'}, _STR, {'type': 'array', 'items': _STR}]}}},
        'section': {'type': 'object', 'additionalProperties': False, 'required': ['section'], 'properties': {
            'section': {'type': ['string', 'null']}, 'contents': {'$ref': '#/$defs/sidebar-contents'}}},
        'sidebar-contents': {'anyOf': [_STR, {'$ref': '#/$defs/contents-auto'}, {'type': 'array', 'items': {'anyOf': [
            {'$ref': '#/$defs/navigation-item'}, {'$ref': '#/$defs/section'}, {'$ref': '#/$defs/contents-auto'}]}}]},
        'sidebar': {'type': 'object', 'additionalProperties': False, 'properties': {
            'id': _STR, 'title': {'type': ['string', 'boolean']}, 'logo': _STR, 'logo-alt': _STR, 'logo-href': _STR,
            'search': {'type': 'boolean'}, 'tools': {'type': 'array', 'items': {'$ref': '#/$defs/navigation-item-object'}},
            'contents': {'$ref': '#/$defs/sidebar-contents'}, 'style': {'enum': ['docked', 'floating']},
            'background': _STR, 'foreground': _STR, 'border': {'type': 'boolean'},
            'alignment': {'enum': ['left', 'right', 'center']}, 'collapse-level': {'type': 'number'},
            'pinned': {'type': 'boolean'}, 'header': {'anyOf': [_STR, {'type': 'array', 'items': _STR}]},
            'footer': {'anyOf': [_STR, {'type': 'array', 'items': _STR}]}}},
    },
    'anyOf': [{'type': 'boolean'}, {'$ref': '#/$defs/sidebar'}, {'type': 'array', 'items': {'$ref': '#/$defs/sidebar'}}],
}


def _quarto_tool():
    import importlib.util
    spec = importlib.util.spec_from_file_location('quarto_sidebar', ROOT / 'tools' / 'quarto_sidebar.py')
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def test_quarto_sidebar_is_grouped_by_area_and_valid():
    import configparser, jsonschema, yaml
    from nac_lab.docs_site import AREAS, area_of
    text = (ROOT / '_quarto.yml').read_text()
    assert (ROOT / 'nbs' / '_quarto.yml').resolve() == (ROOT / '_quarto.yml').resolve()
    q = yaml.safe_load(text)
    sb = q['website']['sidebar']
    jsonschema.validate(sb, QUARTO_SIDEBAR)
    for bad in ({'style': 'side'}, {'contents': [{'sections': 'NEM', 'contents': []}]}, {'contents': [{'text': 1}]},
                {'contents': [{'section': 'NEM', 'contents': [{'href': 'a.ipynb', 'txt': 'a'}]}]}):
        with pytest.raises(jsonschema.ValidationError): jsonschema.validate(bad, QUARTO_SIDEBAR)   # the schema bites
    # nbdev keeps this sidebar (no flat sidebar.yml is written, and none is read)
    cfg = configparser.ConfigParser(); cfg.read(ROOT / 'settings.ini')
    assert cfg['DEFAULT']['custom_sidebar'] == 'True' and 'sidebar.yml' not in q.get('metadata-files', [])
    assert q['project']['type'] == 'website'
    # home first, then one section per area in the order of AREAS; every notebook exactly once, under its area
    nbs = sorted(p.name for p in (ROOT / 'nbs').glob('*.ipynb'))
    assert sb['contents'][0] == {'text': 'Home', 'href': 'index.ipynb'}
    sections = sb['contents'][1:]
    order = [a for _, _, a in AREAS]
    assert [s['section'] for s in sections] == sorted((s['section'] for s in sections), key=order.index)
    listed = ['index.ipynb'] + [i['href'] for s in sections for i in s['contents']]
    assert sorted(listed) == nbs, set(listed) ^ set(nbs)
    for s in sections:
        for i in s['contents']: assert area_of(i['href'])[1] == s['section'], (i, s['section'])
    # and it is what tools/quarto_sidebar.py builds from the notebooks now (run it with --write after adding one)
    tool = _quarto_tool()
    assert tool.replace_block(text, tool.sidebar()) == text, 'run python tools/quarto_sidebar.py --write'


def test_no_broken_internal_links(site):
    "The crawler (nac_lab.docs_links) finds every internal link's file and anchor: 465 led nowhere before issue #33, 0 now."
    from nac_lab.docs_links import broken_links
    bad = broken_links(site)
    assert bad == [], f'{len(bad)} broken internal links, e.g. {bad[:10]}'


def test_no_links_to_a_placeholder_host(site):
    "settings.ini's git_url is a placeholder (example.invalid): Source links are left out rather than pointing nowhere."
    for p in site.glob('*.html'):
        assert not re.search(r'(href|src)="https?://[^"]*example\.invalid', p.read_text()), p.name
