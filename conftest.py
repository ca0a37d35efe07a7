"""pytest configuration shared by the notebook tests (nbval) and `tests/`.

nbval runs every notebook in `nbs/` cell by cell. Three nbdev conventions need help to be honoured:

* `#| eval: false` cells are documentation only: they are skipped.
* cells carrying a directive named in settings.ini's `tst_flags` (e.g. `#| slow`) are skipped unless the
  flag is listed in the environment variable `NAC_LAB_TEST_FLAGS` (space separated), like `nbdev_test --flags`.
* `nbdev_clean` removes execution counts but keeps outputs; nbval would call such a cell "unrun" and refuse
  it, so a cell with saved outputs is treated as run and its outputs are compared.
"""
import configparser, os, tempfile
from pathlib import Path
import pytest
from nac_lab.docs import split_directives  # the one parser of nbdev's `#| name: value` cell directives

ROOT = Path(__file__).parent
# the compiled CPU kernels (nac_lab.nac.runtime.ckernels) are cached in a temporary folder during tests, never in the user's home
os.environ.setdefault('NAC_LAB_CACHE', os.path.join(tempfile.gettempdir(), f'nac_lab-test-cache-{os.getuid()}'))

# Property tests draw the same examples on every run, on every machine and in every worker: hypothesis derives them
# from each test's source instead of a fresh random seed, and keeps no example database between runs.
try:
    from hypothesis import settings as _hypothesis_settings
    _hypothesis_settings.register_profile('nac_lab', derandomize=True, database=None, print_blob=True)
    _hypothesis_settings.load_profile('nac_lab')
except ImportError:   # hypothesis is a test-only dependency
    pass

def _tst_flags() -> set:
    cfg = configparser.ConfigParser(delimiters=['='])
    cfg.read(ROOT / 'settings.ini')
    return set(cfg['DEFAULT'].get('tst_flags', '').split())


def pytest_collection_modifyitems(config, items):
    flags, enabled = _tst_flags(), set(os.environ.get('NAC_LAB_TEST_FLAGS', '').split())
    for item in items:
        cell = getattr(item, 'cell', None)
        if cell is None: continue
        d, _ = split_directives(cell.source)
        if d.get('eval', '').lower() == 'false':
            item.add_marker(pytest.mark.skip(reason='nbdev `#| eval: false` cell'))
            continue
        for f in sorted(flags & set(d) - enabled):
            item.add_marker(pytest.mark.skip(reason=f'`#| {f}` cell (set NAC_LAB_TEST_FLAGS={f} to run it)'))
        if cell.get('execution_count') is None and cell.get('outputs'):
            cell['execution_count'] = 1


class _PastCapture:
    "A text stream to the terminal behind pytest's output capture (the capture is suspended for each write)."
    def __init__(self, capman): self.capman, self.started = capman, False
    def write(self, s):
        import sys
        with self.capman.global_and_fixture_disabled():
            if not self.started: sys.stderr.write('\n')     # the bar gets a line of its own, below the test's name
            self.started = True
            sys.stderr.write(s); sys.stderr.flush()
        return len(s)
    @property
    def encoding(self):
        import sys
        return getattr(sys.__stderr__, 'encoding', None) or 'utf-8'

    def flush(self): pass
    def isatty(self):
        import sys
        with self.capman.global_and_fixture_disabled(): return sys.stderr.isatty()


@pytest.fixture
def fuzz_cases(request):
    """`fuzz_cases(range(n), what)`: the cases of a fuzz loop; with `pytest -v` on a terminal they are counted by a
    progress bar drawn past the output capture (`nac_lab.progress`; NAC_LAB_PROGRESS=0/1 overrides the terminal test)."""
    capman = request.config.pluginmanager.getplugin('capturemanager')
    if request.config.getoption('verbose') < 1 or capman is None: return lambda items, what: items
    from nac_lab.progress import track
    return lambda items, what: track(items, what, unit='case', stream=_PastCapture(capman), leave=True)
