"""Property test of <CONTROL_FLOW> (nbs/24c_nac_control): random programs with nested if/else blocks, built as
NAC instruction streams and, independently, as a Python tree evaluated with plain torch ops. The interpreter
(generated program and step loop), a write/read round trip, the MMAP schedule on every path and the coupled
fast-memory run must all agree with the tree."""
from nac_lab.nac.schedule.mmap import read_checked
import numpy as np, pytest, torch
from nac_lab.nac.format import NacFile, Instruction, write_nac
from nac_lab.nac.runtime.run import Interpreter
from nac_lab.nac.compiler.control import control_map
from nac_lab.nac.schedule.mmap_sim import check_paths
from nac_lab.nac.schedule.mmap import build_schedule, check_mmap
from nac_lab.nac.schedule.mmap_sim import coupled_check

ADD, SUB, MUL, GT = 11, 12, 20, 13
SUM, GETITEM = 201, 202

def gen_block(rng, depth, visible, n):
    "A list of statements; `visible` = names readable here (grows as statements define names)."
    stmts, visible = [], list(visible)
    for _ in range(n):
        r = rng.random()
        if r < 0.3 and depth < 3:
            p = visible[rng.integers(len(visible))]
            k = int(rng.integers(1, 3))
            branches = []
            for _ in range(2):
                body, vis = gen_block(rng, depth + 1, visible, int(rng.integers(0, 4)))
                branches.append((body, [vis[rng.integers(len(vis))] for _ in range(k)]))
            outs = [f'r{len(stmts)}_{depth}_{id(branches)}_{j}' for j in range(k)]
            stmts.append(('if', p, float(rng.normal()), branches, outs)); visible += outs
        elif r < 0.5 and len(visible) > 1:
            a, b = (visible[i] for i in rng.choice(len(visible), 2, replace=False))
            out = f'v{len(stmts)}_{depth}_{rng.integers(1 << 30)}'
            stmts.append(('add2', a, b, out)); visible.append(out)
        else:
            a = visible[rng.integers(len(visible))]
            op = ('add', 'sub', 'mul')[rng.integers(3)]
            c = float(np.round(rng.uniform(-1.5, 1.5), 3))
            out = f'v{len(stmts)}_{depth}_{rng.integers(1 << 30)}'
            stmts.append((op, a, c, out)); visible.append(out)
    return stmts, visible

def evaluate(stmts, env):
    "The tree's meaning with plain torch ops (independent of nac_lab)."
    for s in stmts:
        if s[0] == 'if':
            _, p, thr, branches, outs = s
            body, res = branches[0] if bool(env[p].sum() > thr) else branches[1]
            inner = dict(env); evaluate(body, inner)
            for o, r in zip(outs, res): env[o] = inner[r]
        elif s[0] == 'add2': env[s[3]] = env[s[1]] + env[s[2]]
        else:
            op, a, c, out = s
            env[out] = {'add': lambda x: x + c, 'sub': lambda x: x - c, 'mul': lambda x: x * c}[op](env[a])
    return env

def emit(nac, stmts, at):
    "Append the statements as NAC instructions; `at` maps names to instruction indices."
    at = dict(at)
    for s in stmts:
        if s[0] == 'if':
            _, p, thr, branches, outs = s
            sm = nac.add_op(SUM, 'T', [('ref', at[p])])
            pr = nac.add_op(GT, 'Tf', [('ref', sm), ('const', thr)])
            c = len(nac.ops); nac.ops.append(Instruction.control_flow(pr - c, 0, 0))
            lens = []
            for body, res in branches:
                start = len(nac.ops)
                inner = emit(nac, body, at)
                nac.ops.append(Instruction.output([inner[r] - len(nac.ops) for r in res], final=False))
                lens.append(len(nac.ops) - start)
            nac.ops[c].C = [2] + lens
            for j, o in enumerate(outs): at[o] = nac.add_op(GETITEM, 'Ti', [('ref', c), ('const', j)])
        elif s[0] == 'add2': at[s[3]] = nac.add_op(ADD, 'TT', [('ref', at[s[1]]), ('ref', at[s[2]])])
        else:
            op, a, c, out = s
            at[out] = nac.add_op({'add': ADD, 'sub': SUB, 'mul': MUL}[op], 'Tf', [('ref', at[a]), ('const', c)])
    return at

def program(seed):
    rng = np.random.default_rng(seed)
    stmts, vis = gen_block(rng, 0, ['x'], int(rng.integers(3, 9)))
    result = vis[-1]
    nac = NacFile(n_inputs=1, n_outputs=1)
    nac.cmap[SUM] = 'aten.sum.default'; nac.cmap[GETITEM] = 'getitem'
    nac.ops.append(Instruction.user_input()); nac.input_names[0] = 'x'
    at = emit(nac, stmts, {'x': 0})
    nac.ops.append(Instruction.output([at[result] - len(nac.ops)]))
    return nac, stmts, result

@pytest.mark.parametrize('seed', range(40))
def test_random_blocks(seed):
    nac, stmts, result = program(seed)
    cm = control_map(nac)
    sizes = [0 if ins.A in (3, 6) else 24 for ins in nac.ops]
    nac.mmap = build_schedule(nac, sizes=sizes)
    back = read_checked(write_nac(nac))
    check_mmap(back)
    assert check_paths(back, sizes=sizes) == []
    it, it2 = Interpreter(nac), Interpreter(back)
    gen = torch.Generator().manual_seed(seed)
    for k in range(4):
        x = torch.randn(3, generator=gen, dtype=torch.float64) * 2
        want = evaluate(stmts, {'x': x})[result]
        for got in (it.run(x)[0], it.run_loop(x)[0], it2.run(x)[0]):
            assert torch.equal(got, want)
        if k < 2: assert coupled_check(it, x).ok

def test_programs_have_blocks():
    "The generator really produces constructs, nested ones included."
    counts = [len(control_map(program(s)[0]).constructs) for s in range(40)]
    depths = [max((len(g) for g in control_map(program(s)[0]).guard), default=0) for s in range(40)]
    assert sum(c > 0 for c in counts) >= 20 and max(depths) >= 2

@pytest.mark.parametrize('seed', range(30))
def test_mutated_blocks_fail_typed(seed):
    "A program whose block lengths or offsets are corrupted is refused or runs; any refusal is a NacLabError naming the place."
    from nac_lab.binio import NacLabError
    from nac_lab.nac.format.disasm import listing, graph
    from nac_lab.nac.schedule.mmap import liveness
    nac, _, _ = program(seed % 10 + 100)
    rng = np.random.default_rng(seed)
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(len(nac.ops))); ins = nac.ops[i]
        if ins.A == 6 and rng.random() < 0.7: ins.C[int(rng.integers(1, 3))] = int(rng.integers(0, len(nac.ops) + 3))
        elif ins.D: ins.D[int(rng.integers(len(ins.D)))] = int(rng.integers(-len(nac.ops) - 2, 3))
    x = torch.linspace(-1, 1, 3, dtype=torch.float64)
    for step in (lambda: control_map(nac), lambda: liveness(nac), lambda: build_schedule(nac), lambda: check_paths(nac),
                 lambda: listing(nac), lambda: graph(nac).source, lambda: Interpreter(nac).run(x), lambda: Interpreter(nac).run_loop(x)):
        try: step()
        except NacLabError as ex: assert 'instruction' in str(ex) or 'offset' in str(ex), str(ex)
