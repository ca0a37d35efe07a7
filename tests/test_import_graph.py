"""The import graph of nac_lab (module-level and function-local imports; `if TYPE_CHECKING:` blocks are not imports at
run time): no import cycle except the ones issue #14 still has to break, and no module joins those."""
import ast
from pathlib import Path
import nac_lab

PKG = Path(nac_lab.__file__).resolve().parent
KNOWN = []          # issue #14 broke the last cycles (NAC runtime, IR v2, lowering): none may come back

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
            rel = pkg_parts[:len(pkg_parts) - (node.level - 1)] + ([node.module] if node.module else [])
            base = '.'.join(rel) if node.level else node.module
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

def test_no_import_cycle():
    g = import_graph()
    assert 'nac_lab.irv2.run' in g and 'nac_lab.nac.format' in g
    bad = [sorted(c) for c in cycles(g) if not any(c <= k for k in KNOWN)]
    assert not bad, f'import cycles: {bad}'

def _modules_after(*argv) -> dict:
    "Exit code and which heavy modules are loaded after `nac-lab ARGV` runs in a fresh interpreter."
    import json, subprocess, sys
    code = ('import json, sys\nfrom nac_lab.cli import main\nrc = main(sys.argv[1:])\n'
            "print(json.dumps({'rc': rc, **{m: m in sys.modules for m in ('torch', 'nac_lab.nac.compile', 'nac_lab.nac.optimize')}}))")
    out = subprocess.run([sys.executable, '-c', code, *argv], capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])

def test_inspect_graph_schedule_do_not_import_torch(tmp_path):
    "Reading a .nac file (inspect, graph, schedule show) needs neither torch nor the compiler."
    nac = str(PKG.parent / 'data' / 'nac' / 'tiny_mlp.nac')
    for argv in (('inspect', nac, '--ops'), ('graph', nac, '-o', str(tmp_path / 'g.svg')), ('schedule', 'show', nac)):
        assert _modules_after(*argv) == {'rc': 0, 'torch': False, 'nac_lab.nac.compile': False, 'nac_lab.nac.optimize': False}, argv

def test_run_does_not_import_the_compiler(tmp_path):
    "`nac-lab run` executes a file with the interpreter only (torch, but not the compiler or its optimizer)."
    import numpy as np
    np.save(tmp_path / 'x.npy', np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16))
    got = _modules_after('run', str(PKG.parent / 'data' / 'nac' / 'tiny_mlp.nac'), '-i', f'x={tmp_path / "x.npy"}')
    assert got == {'rc': 0, 'torch': True, 'nac_lab.nac.compile': False, 'nac_lab.nac.optimize': False}
