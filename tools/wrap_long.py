#!/usr/bin/env python
"""Developer helper: wrap code lines longer than the limit at a comma inside brackets, in notebooks and Python files.

    python tools/wrap_long.py [--limit 140] FILE.ipynb|FILE.py ...

Only implicit continuations are used (a break after a `,` inside `()`, `[]` or `{}`, the next line aligned after the
opening bracket), and every rewritten cell or file must parse to exactly the same AST as before, so the change cannot
alter behaviour. A long string literal inside brackets is split at a space into two adjacent literals (never inside
an f-string's braces); a string outside brackets is first put in parentheses; `a; b` becomes two lines and
`if c: stmt` puts `stmt` on a line of its own. Comments and the lines of triple-quoted strings are left alone.
"""
import argparse, ast, io, json, sys, tokenize
from pathlib import Path

def _split_points(src:str, limit:int) -> dict:
    "`{line number: (column after the comma, indent of the continuation)}` for the first over-long line that has one."
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    lines = src.split('\n')
    stack, best = [], {}
    for t in toks:
        if t.type == tokenize.OP and t.string in '([{': stack.append(t)
        elif t.type == tokenize.OP and t.string in ')]}': stack and stack.pop()
        elif t.type == tokenize.OP and t.string == ',' and stack:
            row, col = t.start
            if len(lines[row - 1]) <= limit or col + 1 > limit - 1: continue
            opener = stack[-1]
            indent = opener.end[1] if opener.start[0] == row else len(lines[row - 1]) - len(lines[row - 1].lstrip()) + 4
            rest = lines[row - 1][col + 1:].lstrip()
            if not rest or rest.startswith('#') or indent + len(rest) >= len(lines[row - 1]): continue
            if col + 1 > indent + 8: best[row] = (col + 1, indent)          # the rightmost comma that fits wins
    return best

def _string_split(src:str, limit:int):
    "`(row, col, new text)` that splits an over-long string literal inside brackets into two adjacent literals, or None."
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    lines = src.split('\n'); depth = 0
    for t in toks:
        if t.type == tokenize.OP and t.string in '([{': depth += 1
        elif t.type == tokenize.OP and t.string in ')]}': depth -= 1
        elif t.type == tokenize.STRING and depth and t.start[0] == t.end[0] and len(lines[t.start[0] - 1]) > limit:
            row, c0 = t.start; text = t.string
            pre = text[:len(text) - len(text.lstrip('rRbBfFuU'))]
            q = text[len(pre)]
            if text[len(pre):len(pre) + 3] in ('"""', "'''") or 'b' in pre.lower(): continue
            body, braces, cut = text[len(pre) + 1:-1], 0, None
            for i, ch in enumerate(body):
                if 'f' in pre.lower() and ch in '{}': braces += 1 if ch == '{' else -1
                col = c0 + len(pre) + 1 + i
                if (ch == ' ' and braces == 0 and col < limit - 2 and i > 10 and body[i - 1] != '\\'
                        and len(body) - i > 8): cut = i + 1
            if cut is None or len(body) - cut < 8: continue
            opener = [x for x in toks if x.start[0] == row and x.type == tokenize.OP and x.string in '([{' and x.start[1] < c0]
            indent = (opener[-1].end[1] if opener else c0)
            new = f'{pre}{q}{body[:cut]}{q}\n' + ' ' * indent + f'{pre}{q}{body[cut:]}{q}'
            return row, c0, len(text), new
    return None

_COMPOUND = ('if ', 'elif ', 'else', 'for ', 'while ', 'with ', 'def ', 'class ', 'try', 'except', 'finally', 'async ', '@')

def _restructure(src:str, limit:int):
    """One rewrite of an over-long line that keeps the AST: a string at bracket depth 0 gets parentheses (so that
    `_string_split` can cut it), `stmt; stmt` becomes two lines, `if cond: stmt` puts `stmt` on its own line."""
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    lines = src.split('\n'); depth = 0
    for t in toks:
        if t.type == tokenize.OP and t.string in '([{': depth += 1
        elif t.type == tokenize.OP and t.string in ')]}': depth -= 1
        row = t.start[0]
        if row > len(lines) or t.start[0] != t.end[0] or len(lines[row - 1]) <= limit or depth: continue
        line = lines[row - 1]; ind = len(line) - len(line.lstrip()); head = line.lstrip()
        if t.type == tokenize.STRING and t.end[1] > limit and not head.startswith(('"""', "'''")):
            return row, line[:t.start[1]] + '(' + t.string + ')' + line[t.end[1]:]
        if t.type == tokenize.OP and t.string == ';' and not head.startswith(_COMPOUND):
            return row, line[:t.start[1]].rstrip() + '\n' + ' ' * ind + line[t.end[1]:].lstrip()
        if (t.type == tokenize.OP and t.string == ':' and head.startswith(('if ', 'elif ', 'else')) and line[t.end[1]:].strip()
                and not line[t.end[1]:].lstrip().startswith('#')):
            return row, line[:t.end[1]] + '\n' + ' ' * (ind + 4) + line[t.end[1]:].lstrip()
    return None

def wrap(src:str, limit:int=140) -> str:
    "`src` with its over-long lines broken after commas inside brackets (same AST), as far as that is possible."
    try: before = ast.dump(ast.parse(src))
    except SyntaxError: return src
    for _ in range(200):
        try: pts = _split_points(src, limit)
        except (tokenize.TokenError, IndentationError, SyntaxError): return src
        lines = src.split('\n')
        if pts:
            row, (col, indent) = max(pts.items())                         # one break per pass, from the bottom
            line = lines[row - 1]
            lines[row - 1:row] = [line[:col].rstrip(), ' ' * indent + line[col:].lstrip()]
        else:
            try: cut = _string_split(src, limit)
            except (tokenize.TokenError, IndentationError, SyntaxError): cut = None
            if cut is not None:
                row, c0, n, text = cut
                line = lines[row - 1]; lines[row - 1] = line[:c0] + text + line[c0 + n:]
            else:
                try: re_ = _restructure(src, limit)
                except (tokenize.TokenError, IndentationError, SyntaxError): re_ = None
                if re_ is None: break
                lines[re_[0] - 1] = re_[1]
        new = '\n'.join(lines)
        try: ok = ast.dump(ast.parse(new)) == before
        except SyntaxError: ok = False
        if not ok: break
        src = new
    return src

def _cell_src(c): return ''.join(c['source'])

def wrap_notebook(path:Path, limit:int) -> int:
    "Wrap the code cells of notebook `path` in place; returns the number of cells changed."
    nb = json.loads(path.read_text()); n = 0
    for c in nb['cells']:
        if c['cell_type'] != 'code': continue
        s = _cell_src(c)
        if not any(len(l) > limit for l in s.split('\n')) or any(l.lstrip().startswith(('%', '!')) for l in s.split('\n')): continue
        t = wrap(s, limit)
        if t != s:
            lines = t.split('\n'); c['source'] = [l + '\n' for l in lines[:-1]] + ([lines[-1]] if lines[-1] else []); n += 1
    if n: path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    return n

def _cut(text:str, width:int) -> int|None:
    "Where the first sentence of a description ends (after its period), if it fits `width` characters; else None."
    depth, code = 0, False
    for k, ch in enumerate(text[:width]):
        if ch == '`': code = not code
        elif not code: depth += ch in '(['; depth -= ch in ')]'
        if ch == '.' and depth == 0 and not code and (k + 1 == len(text) or text[k + 1] == ' '): return k + 1
    return None

def wrap_description(path:Path, limit:int) -> bool:
    """Rewrap the `> ` description of notebook `path` so its first line, which nbdev makes the module docstring, is the
    description's first sentence and fits `limit` with its quotes; the rest continues on more `> ` lines (one paragraph in
    the docs). A first sentence too long to fit is never cut mid-sentence: the notebook is left as it is and named, for its
    author to write a shorter first sentence."""
    nb = json.loads(path.read_text())
    c = next((c for c in nb['cells'] if c['cell_type'] == 'markdown'), None)
    if c is None: return False
    lines = _cell_src(c).split('\n')
    i = next((k for k, l in enumerate(lines) if l.startswith('> ')), None)
    if i is None or len(lines[i]) - 2 + 6 <= limit: return False
    j = i
    while j + 1 < len(lines) and lines[j + 1].startswith('> '): j += 1
    text = ' '.join(l[2:].strip() for l in lines[i:j + 1])
    k = _cut(text, limit - 6)
    if k is None:
        print(f'{path}: the first sentence of the description does not fit {limit - 6} characters; write a shorter one', file=sys.stderr)
        return False
    first, rest = text[:k].rstrip(), text[k:].strip()
    out, cur = ['> ' + first], ''
    for w in rest.split(' '):
        if cur and len(cur) + 1 + len(w) > 114: out.append('> ' + cur); cur = w
        else: cur = f'{cur} {w}' if cur else w
    if cur: out.append('> ' + cur)
    lines[i:j + 1] = out
    t = '\n'.join(lines); c['source'] = [l + '\n' for l in t.split('\n')[:-1]] + [t.split('\n')[-1]]
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    return True

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('files', nargs='+'); p.add_argument('--limit', type=int, default=140)
    a = p.parse_args(argv)
    for f in map(Path, a.files):
        if f.suffix == '.ipynb': n = wrap_notebook(f, a.limit) + wrap_description(f, a.limit)
        else:
            s = f.read_text(); t = wrap(s, a.limit); n = int(t != s)
            if n: f.write_text(t)
        if n: print(f'{f}: {n} changed')

if __name__ == '__main__': sys.exit(main())
