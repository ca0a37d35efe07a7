"""Module docstrings read as sentences: nbdev makes each module's docstring from the first `> ` line of its notebook's
description, so that line must be a whole sentence (issue #29 item 6), and tools/wrap_long.py must never cut one."""
import ast, importlib.util, json
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p for p in (ROOT / 'nac_lab').rglob('*.py') if p.name != '_modidx.py')


@pytest.mark.parametrize('path', MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_docstring_is_a_sentence(path):
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if doc is None:
        assert path.name == '__init__.py', f'{path}: an exported module without a docstring (its notebook has no `> ` description)'
        return
    assert doc.rstrip().endswith('.'), f'{path}: docstring ends mid-sentence: {doc!r}'


def test_every_description_starts_with_a_sentence_that_fits():
    for nb in sorted((ROOT / 'nbs').glob('*.ipynb')):
        first = ''.join(json.loads(nb.read_text())['cells'][0]['source'])
        lines = [line for line in first.split('\n') if line.startswith('> ')]
        if not lines: continue
        assert lines[0].endswith('.') and len(lines[0]) - 2 + 6 <= 140, f'{nb.name}: {lines[0]!r}'


def _wrap_long():
    spec = importlib.util.spec_from_file_location('wrap_long', ROOT / 'tools' / 'wrap_long.py')
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m


def _nb(tmp_path, desc_lines):
    p = tmp_path / 'x.ipynb'
    cell = {'cell_type': 'markdown', 'metadata': {}, 'source': '# x\n\n' + '\n'.join('> ' + d for d in desc_lines)}
    p.write_text(json.dumps({'cells': [cell], 'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}))
    return p


def test_wrap_description_cuts_after_the_first_sentence(tmp_path):
    m = _wrap_long()
    first = 'Read a thing (with a period. inside brackets) and check it.'
    p = _nb(tmp_path, [first + ' ' + 'Then a long second sentence follows, ' * 4 + 'and ends.'])
    assert m.wrap_description(p, 80)
    src = ''.join(json.loads(p.read_text())['cells'][0]['source'])
    assert src.split('\n')[2] == '> ' + first
    assert all(len(line) <= 116 for line in src.split('\n'))


def test_wrap_description_never_cuts_mid_sentence(tmp_path, capsys):
    m = _wrap_long()
    long_sentence = 'A single sentence that runs on, ' * 5 + 'and only ends here.'
    p = _nb(tmp_path, [long_sentence])
    before = p.read_text()
    assert not m.wrap_description(p, 80)
    assert p.read_text() == before
    assert 'write a shorter one' in capsys.readouterr().err
