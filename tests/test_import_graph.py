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
    mods = ('torch', 'nac_lab.nac.compiler.compile', 'nac_lab.nac.compiler.optimize')
    code = ('import json, sys\nfrom nac_lab.cli import main\nrc = main(sys.argv[1:])\n'
            f"print(json.dumps({{'rc': rc, **{{m: m in sys.modules for m in {mods!r}}}}}))")
    out = subprocess.run([sys.executable, '-c', code, *argv], capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout.strip().splitlines()[-1])

def test_inspect_graph_schedule_do_not_import_torch(tmp_path):
    "Reading a .nac file (inspect, graph, schedule show) needs neither torch nor the compiler."
    nac = str(PKG.parent / 'data' / 'nac' / 'tiny_mlp.nac')
    for argv in (('inspect', nac, '--ops'), ('graph', nac, '-o', str(tmp_path / 'g.svg')), ('schedule', 'show', nac)):
        got = _modules_after(*argv)
        assert got == {'rc': 0, 'torch': False, 'nac_lab.nac.compiler.compile': False, 'nac_lab.nac.compiler.optimize': False}, argv

def test_run_does_not_import_the_compiler(tmp_path):
    "`nac-lab run` executes a file with the interpreter only (torch, but not the compiler or its optimizer)."
    import numpy as np
    np.save(tmp_path / 'x.npy', np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16))
    got = _modules_after('run', str(PKG.parent / 'data' / 'nac' / 'tiny_mlp.nac'), '-i', f'x={tmp_path / "x.npy"}')
    assert got == {'rc': 0, 'torch': True, 'nac_lab.nac.compiler.compile': False, 'nac_lab.nac.compiler.optimize': False}

# The interpreter's decoded step list is its own business (issue #29): other areas read the typed graph
# (`nac_lab.nac.format.graph`) and the public run API (`input_slots`, `prepare_inputs`, `run_values`, `NacModel.run_with_values`).
PRIVATE_RUN = {'_inputs', 'run_steps', 'steps', 'n_run', 'slots'}
STEP_OWNERS = {'nac_lab/nac/runtime/run.py', 'nac_lab/nac/format/graph.py'}
#: modules that are themselves executors of the step list, beside the interpreter (still to move onto a public API)
STEP_EXECUTORS = {'nac_lab/nac/schedule/mmap_sim.py': 'coupled MMAP run: executes the steps through simulated fast memory',
                  'nac_lab/nac/format/check.py': 'decodes each instruction with Interpreter._decode on a partial interpreter'}

def _interp_expr(node, names) -> bool:
    "Whether `node` evidently is an interpreter: a name bound to one, `x.interpreter` / `x.it`, or `Interpreter(...)`."
    if isinstance(node, ast.Name): return node.id in names
    if isinstance(node, ast.Attribute): return node.attr in ('interpreter', 'it', '_interp')
    if isinstance(node, ast.Call): return getattr(node.func, 'id', getattr(node.func, 'attr', '')) in ('Interpreter', '_interpreter')
    return False

def interpreter_internals(src: str) -> list:
    "`(line, attribute)` of each read of a private interpreter attribute in module source `src`."
    tree = ast.parse(src)
    names = {'it', 'interp', 'interpreter'}
    for node in ast.walk(tree):                                  # names bound to something that mentions an interpreter
        if isinstance(node, ast.Assign) and 'nterpreter' in ast.unparse(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return sorted((n.lineno, n.attr) for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and n.attr in PRIVATE_RUN and _interp_expr(n.value, names))

def test_interpreter_internals_scan():
    assert interpreter_internals('it = m.interpreter\nx = it.steps[:it.n_run]\n') == [(2, 'n_run'), (2, 'steps')]
    assert interpreter_internals('y = m.interpreter.slots\nz = Interpreter(nac)._inputs((), {})\n') == [(1, 'slots'), (2, '_inputs')]
    assert interpreter_internals('v = model.interpreter\nv.run_steps([])\n') == [(2, 'run_steps')]
    assert interpreter_internals('t = tiling()\nt.slots + args.steps\n') == []          # other objects' attributes of the same name

def test_no_module_reads_interpreter_internals():
    bad = {}
    for f in sorted(PKG.rglob('*.py')):
        rel = f.relative_to(PKG.parent).as_posix()
        if rel in STEP_OWNERS or rel in STEP_EXECUTORS: continue
        hits = interpreter_internals(f.read_text())
        if hits: bad[rel] = hits
    assert not bad, f'read the typed graph (nac.graph) or the public run API instead of interpreter internals: {bad}'

# Package layering (issue #29): foundation <- format areas <- lowering <- its consumers <- benchmarks and commands.
# A module's package is its subpackage under nac_lab (`nac`, `nem`, …) or, for a top-level module, its own name; every
# command module (`cli.py`, `cli_*.py`, anything under a `commands` package) belongs to the command layer, which may
# import anything, because it is what the user runs.
FOUNDATION = {'__init__', 'layout', 'errors', 'binio', 'dtypes', 'fileio', 'guard', 'safetensors', 'npyio', 'progress', 'config',
              'core', 'viz', 'torchref', 'clikit'}
ALLOWED = {  # package: the non-foundation packages it may import
    'nac': set(), 'fxp': set(), 'irv2': set(), 'trillim': set(),
    'nem': {'fxp'},                               # NEM kernels round with the fixed-point rules
    'ark': {'nac'}, 'onnx': {'nac'},              # exchange formats, converted to and from NAC programs
    'lower': {'nac', 'nem', 'fxp'},               # the lowering: NAC programs to NEM programs
    'hw': {'nac', 'nem', 'fxp', 'lower'},         # hardware from lowered layers
    'genome': {'nac', 'lower', 'bench'},          # bench: the corpus is the peer suite whose model lists bench.peers owns
    'docs': {'docs_links', 'docs_site'}, 'docs_links': set(), 'docs_site': set(),   # the docs builder, its links and page template
    'bench': None, 'COMMANDS': None, 'cliref': None, '_modidx': set(),                # None: anything; _modidx: nbdev's index
}

def package_of(module: str) -> str:
    "The layering package of a nac_lab module name."
    parts = module.split('.')
    if parts[-1] == 'cli' or parts[-1].startswith('cli_') or 'commands' in parts[1:]: return 'COMMANDS'
    return parts[1] if len(parts) > 1 else '__init__'

def layering_violations(g: dict) -> list:
    "`(importer, imported)` module pairs whose packages the table does not allow."
    bad = []
    for m, deps in g.items():
        a = package_of(m)
        for d in deps:
            b = package_of(d)
            if a == b or b in FOUNDATION: continue
            allowed = set() if a in FOUNDATION else ALLOWED.get(a, set())
            if allowed is not None and b not in allowed: bad.append((m, d))
    return sorted(bad)

def test_package_of():
    assert [package_of(m) for m in ('nac_lab.nac.runtime.run', 'nac_lab.nem.commands.cli', 'nac_lab.lower.cli', 'nac_lab.guard',
                                    'nac_lab')] == ['nac', 'COMMANDS', 'COMMANDS', 'guard', '__init__']
    g = {'nac_lab.nac.x': {'nac_lab.lower.y'}, 'nac_lab.lower.y': {'nac_lab.nac.x'}, 'nac_lab.guard': {'nac_lab.nac.x'}}
    assert layering_violations(g) == [('nac_lab.guard', 'nac_lab.nac.x'), ('nac_lab.nac.x', 'nac_lab.lower.y')]

def test_package_layering():
    g = import_graph()
    assert set(ALLOWED) | FOUNDATION >= {package_of(m) for m in g}, {package_of(m) for m in g} - (set(ALLOWED) | FOUNDATION)
    assert layering_violations(g) == []
