"""Rewrite references to moved module paths (the `MOVED` table of nac_lab/layout.py) to their new paths.

Old paths keep working at run time through `nac_lab.layout`'s alias finder; this tool keeps the sources on the new
paths: notebooks (code, prose and `#| default_exp`), tests, tools. `--check` lists what it would change and exits 1.
Idempotent: a new path never matches an old one."""
import argparse, importlib.util, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

def moved() -> dict:
    "The MOVED table, read from nac_lab/layout.py without importing the package."
    spec = importlib.util.spec_from_file_location('_layout', ROOT/'nac_lab'/'layout.py')
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m.MOVED

def rewriter(table:dict):
    "A function rewriting dotted module paths, file paths and `default_exp` names of `table` in a text."
    dotted = {o: n for o, n in table.items()}
    files = {o.replace('.', '/') + '.py': n.replace('.', '/') + '.py' for o, n in table.items()}
    exps = {o[len('nac_lab.'):]: n[len('nac_lab.'):] for o, n in table.items()}
    alt = lambda keys: '|'.join(re.escape(k) for k in sorted(keys, key=len, reverse=True))
    r_dot = re.compile(rf'(?<![\w.])({alt(dotted)})(?![\w])')
    r_file = re.compile(rf'(?<![\w])({alt(files)})')
    r_exp = re.compile(rf'(#\| *default_exp +)({alt(exps)})(?![\w.])')
    def sub(text:str) -> str:
        text = r_dot.sub(lambda m: dotted[m.group(1)], text)
        text = r_file.sub(lambda m: files[m.group(1)], text)
        return r_exp.sub(lambda m: m.group(1) + exps[m.group(2)], text)
    return sub

def targets() -> list:
    "The source files the rewrite covers."
    out = sorted(ROOT.glob('nbs/*.ipynb')) + sorted(ROOT.glob('tests/**/*.py')) + sorted(ROOT.glob('tools/*.py'))
    own = ('rewrite_moved.py', '05a_layout.ipynb')          # the table itself and the tests of the old paths keep the old names
    return [p for p in out + [ROOT/'conftest.py', ROOT/'README.md', ROOT/'Makefile'] if p.exists() and p.name not in own]

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--check', action='store_true', help='only list the files that still use old paths (exit 1 if any)')
    args = ap.parse_args(argv)
    sub, changed = rewriter(moved()), []
    for p in targets():
        text = p.read_text()
        new = sub(text)
        if new != text:
            changed.append(p.relative_to(ROOT))
            if not args.check: p.write_text(new)
    for p in changed: print(p)
    return 1 if (args.check and changed) else 0

if __name__ == '__main__': sys.exit(main())
