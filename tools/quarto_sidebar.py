#!/usr/bin/env python
"""Developer helper: the `website.sidebar` of `_quarto.yml`, grouped by area the way the offline docs are.

    python tools/quarto_sidebar.py           # print the sidebar block built from nbs/*.ipynb
    python tools/quarto_sidebar.py --write   # put it into _quarto.yml (the rest of the file is kept)
    python tools/quarto_sidebar.py --check   # exit 1 when _quarto.yml's sidebar is not the one built now

Where Quarto is installed, `nbdev_docs` renders `nbs/` with `_quarto.yml` (settings.ini has
`custom_sidebar = True`, so nbdev keeps this sidebar instead of writing a flat `sidebar.yml`). The areas
come from `nac_lab.docs_site.AREAS` (a notebook's area is its number), and each page is listed under the same
label as in the offline site: its module name, `nac_lab` for the package, or its title when it exports
nothing. Run `--write` after adding, renaming or removing a notebook; tests/test_docs.py checks it was.
"""
import re, sys
from pathlib import Path
import nbformat, yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from nac_lab.docs import _module_of   # noqa: E402
from nac_lab.docs_site import area_of   # noqa: E402  (the offline site's own grouping and labels)

def _label(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    mod = _module_of(nb)
    if mod: return 'nac_lab' if mod == '__init__' else mod.removesuffix('.__init__')
    first = next((c.source for c in nb.cells if c.cell_type == 'markdown'), '')
    m = re.match(r'#\s+(.+)', first.strip())
    return m.group(1).strip() if m else path.stem

def sidebar(nbs: Path = ROOT / 'nbs') -> dict:
    "The `website.sidebar` mapping: the home page, then one section per area in `AREAS` order."
    pages = sorted((p for p in nbs.glob('*.ipynb') if p.stem != 'index'), key=lambda p: (area_of(p.name), p.name))
    contents = [{'text': 'Home', 'href': 'index.ipynb'}] if (nbs / 'index.ipynb').exists() else []
    for rank, area in sorted({area_of(p.name) for p in pages}):
        contents.append({'section': area, 'contents': [{'text': _label(p),
                                                        'href': p.name} for p in pages if area_of(p.name) == (rank, area)]})
    return {'style': 'floating', 'contents': contents}

def block(sb: dict) -> str:
    "The sidebar as the indented YAML block that follows `  sidebar:` under `website:`."
    text = yaml.safe_dump(sb, sort_keys=False, allow_unicode=True, width=200)
    return ''.join('    ' + line + '\n' for line in text.splitlines())

def replace_block(quarto: str, sb: dict) -> str:
    "`quarto` (the text of _quarto.yml) with the block under `  sidebar:` replaced by `sb`."
    lines = quarto.splitlines(keepends=True)
    i = next(k for k, l in enumerate(lines) if l.rstrip() == '  sidebar:')
    j = i + 1
    while j < len(lines) and (lines[j].startswith('    ') or not lines[j].strip()): j += 1
    while j > i + 1 and not lines[j - 1].strip(): j -= 1            # keep the blank lines that follow the block
    return ''.join(lines[:i + 1]) + block(sb) + ''.join(lines[j:])

if __name__ == '__main__':
    q = ROOT / '_quarto.yml'
    want = replace_block(q.read_text(), sidebar())
    if '--write' in sys.argv:
        from nac_lab.fileio import atomic_write                    # the project's one writer: temp file + rename, mode kept
        atomic_write(q, want)
    elif '--check' in sys.argv:
        if q.read_text() != want: sys.exit('_quarto.yml: the sidebar is out of date; run python tools/quarto_sidebar.py --write')
    else: print(block(sidebar()), end='')
