"""The import graph of nac_lab (module-level and function-local imports; `if TYPE_CHECKING:` blocks are not imports at
run time): no import cycle except the ones issue #14 still has to break, and no module joins those."""
import ast
from pathlib import Path
import nac_lab

PKG = Path(nac_lab.__file__).resolve().parent
# Issue #14 (open) lists the cycles still to break, all through function-local imports: in the NAC runtime (format <->
# guard/weights/mmap/ops, control <-> compile/run/mmap, cli_run <-> cli_mep). A cycle that is not inside that group, or a
# module joining it, fails the test: the list may only shrink.
KNOWN = [{f'nac_lab.nac.{m}' for m in ('format', 'ops', 'weights', 'guard', 'mmap', 'mmap_sim', 'control', 'signature', 'run',
                                      'compile', 'cli_run', 'cli_mep')}]

def _is_type_checking(node) -> bool:
    t = node.test
    return isinstance(node, ast.If) and (getattr(t, 'id', None) == 'TYPE_CHECKING' or getattr(t, 'attr', None) == 'TYPE_CHECKING')

def _imports(tree, pkg_parts):
    "Module names imported anywhere in `tree` except under `if TYPE_CHECKING:`."
    out, todo = set(), [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node): todo += node.orelse; continue
        if isinstance(node, ast.ImportFrom):
            base = '.'.join(pkg_parts[:len(pkg_parts) - (node.level - 1)] + ([node.module] if node.module else [])) if node.level else node.module
            out |= {base} | {f'{base}.{a.name}' for a in node.names}
        elif isinstance(node, ast.Import): out |= {a.name for a in node.names}
        todo += list(ast.iter_child_nodes(node))
    return out

def import_graph() -> dict:
    "`{module: {nac_lab modules it imports}}` for every module of the package."
    mods = {}
    for f in sorted(PKG.rglob('*.py')):
        parts = ['nac_lab', *f.relative_to(PKG).with_suffix('').parts]
        is_init = parts[-1] == '__init__'
        name = '.'.join(parts[:-1] if is_init else parts)
        mods[name] = _imports(ast.parse(f.read_text()), parts[:-1])
    return {m: {d for d in deps if d in mods and d != m} for m, deps in mods.items()}

def cycles(g) -> list:
    "Strongly connected components with more than one module (Tarjan, iterative)."
    index, low, stack, on, out, n = {}, {}, [], set(), [], 0
    for root in g:
        if root in index: continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = n; n += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n; n += 1; stack.append(w); on.add(w); work.append((w, iter(sorted(g[w]))))
                elif w in on: low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work: low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop(); on.discard(w); comp.add(w)
                    if w == v: break
                if len(comp) > 1: out.append(comp)
    return out

def test_cycle_finder():
    assert cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [{'a', 'b', 'c'}]
    assert cycles({'a': {'b'}, 'b': set()}) == []

def test_no_import_cycle_outside_the_known_ones():
    g = import_graph()
    assert 'nac_lab.irv2.run' in g and 'nac_lab.nac.format' in g
    bad = [sorted(c) for c in cycles(g) if not any(c <= k for k in KNOWN)]
    assert not bad, f'import cycles outside the known ones: {bad}'
