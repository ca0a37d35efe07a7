#!/usr/bin/env python
"""Developer helper: edit notebooks as percent-format text, then build real notebooks from it.

    python tools/nb.py topy  nbs/00_binio.ipynb  /tmp/00_binio.py   # notebook -> editable text
    python tools/nb.py build /tmp/00_binio.py   nbs/00_binio.ipynb  # text -> executed, clean notebook

Cells in the text form start with `# %%` (code) or `# %% [markdown]` (markdown; every line is
prefixed with `# `). `build` executes the notebook in `nbs/` (as nbval will), keeps the outputs,
then runs nbdev_clean on it so the committed file is exactly what CI expects.
"""
import json, subprocess, sys
from pathlib import Path

def py_to_cells(text):
    "Split percent-format `text` into notebook cells."
    cells, kind, buf = [], None, []
    def flush():
        if kind is None: return
        lines = buf[:]
        while lines and not lines[-1].strip(): lines.pop()
        while lines and not lines[0].strip(): lines.pop(0)
        if kind == 'markdown': lines = [l[2:] if l.startswith('# ') else l.lstrip('#') for l in lines]
        src = '\n'.join(lines)
        cell = {'cell_type': kind, 'metadata': {}, 'source': src}
        if kind == 'code': cell.update(execution_count=None, outputs=[])
        cells.append(cell)
    for line in text.splitlines():
        if line.startswith('# %%'):
            flush(); buf = []
            kind = 'markdown' if '[markdown]' in line else 'code'
        else:
            if kind is None: continue
            buf.append(line)
    flush()
    return cells

def cells_to_py(cells):
    "Render notebook cells as percent-format text."
    out = []
    for c in cells:
        src = c['source'] if isinstance(c['source'], str) else ''.join(c['source'])
        if c['cell_type'] == 'markdown':
            out.append('# %% [markdown]\n' + '\n'.join('# ' + l if l else '#' for l in src.splitlines()))
        else: out.append('# %%\n' + src)
    return '\n\n'.join(out) + '\n'

def build(src, dst, execute=True):
    "Write notebook `dst` from percent text `src`, execute it in its folder, and nbdev_clean it."
    import nbformat
    cells = py_to_cells(Path(src).read_text())
    nb = nbformat.v4.new_notebook()
    nb.metadata = {'kernelspec': {'display_name': 'python3', 'language': 'python', 'name': 'python3'}}
    for c in cells:
        nb.cells.append(nbformat.v4.new_markdown_cell(c['source']) if c['cell_type'] == 'markdown'
                        else nbformat.v4.new_code_cell(c['source']))
    dst = Path(dst)
    if execute:
        from nbconvert.preprocessors import ExecutePreprocessor
        ep = ExecutePreprocessor(timeout=1200, kernel_name='python3')
        try: ep.preprocess(nb, {'metadata': {'path': str(dst.parent.resolve())}})
        finally:
            nbformat.write(nb, str(dst))
    else: nbformat.write(nb, str(dst))
    bindir = Path(sys.executable).parent
    subprocess.run([str(bindir/'nbdev_clean'), '--fname', str(dst)], check=True)

if __name__ == '__main__':
    cmd, a, b = sys.argv[1:4]
    if cmd == 'topy': Path(b).write_text(cells_to_py(json.loads(Path(a).read_text())['cells']))
    elif cmd == 'build': build(a, b, execute='--no-exec' not in sys.argv)
    else: sys.exit(f'unknown command {cmd!r}')
