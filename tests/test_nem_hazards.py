"""NEM hazard analysis: the near-linear simulator agrees with a direct quadratic model on random programs, and
stays linear on the hostile shapes of issue #13 (long dependency chains, many independent transfers).

The reference model below is the straightforward definition of hazard rule 1 under RULINGS-style ordering
(notebook 34c): every task keeps its full set of incomplete ancestors, and every new access is compared with
every pending access of its storage. It is slow but obviously right; the test compares the positions of
the reported hazards.
"""
import random
import pytest
import nac_lab.nem.analysis.hazards as hz
from nac_lab.nem.analysis.check import check

class ReferenceSim(hz.HazardSim):
    "Hazard rule 1 by brute force: full ancestor sets and a list of all pending accesses per storage."
    def __init__(self, ctx):
        super().__init__(ctx)
        self.anc, self.pending = {}, {}

    def complete(self, tid):
        if tid in self.done: return
        self.done.add(tid); self.done |= self.anc.get(tid, frozenset())

    def task(self, node, reads, writes, deps, env=None):
        tid = self.n; self.n += 1
        self.deps.append(())
        anc = set()
        for d in deps or ():
            p = self.tok.get(d)
            if p is not None and p not in self.done: anc.add(p); anc |= self.anc.get(p, set())
        anc = self.anc[tid] = frozenset(a for a in anc if a not in self.done)
        for w, rvs in ((False, reads), (True, writes)):
            for rv in rvs:
                if rv is None or rv.off is None or rv.ext is None or rv.ext <= 0: continue
                lo, hi = rv.off, rv.off + rv.ext
                lst = self.pending.setdefault(self.storage(rv.buffer), [])
                lst[:] = [e for e in lst if e[0] not in self.done]
                for e in lst:
                    if e[0] == tid or e[0] in anc or not (w or e[3]) or not (e[1] < hi and lo < e[2]): continue
                    if (id(node), id(e[4])) in self.reported: continue
                    self.reported.add((id(node), id(e[4])))
                    self.ctx.report('error', 'hazard.write', 'unordered', hz.operand_pos(node, rv))
                    break
                lst.append((tid, lo, hi, w, node))
        if getattr(node, 'assign', None): self.tok[node.assign] = tid
        if getattr(node, 'sync', False): self.complete(tid)
        live = self.n - len(self.done)
        if live > self.max_live: self.max_live, self.max_live_at = live, node
        return tid

def random_program(rng, n=8):
    ("A small random program over one L1 buffer: transfers and relus on overlapping 8-byte-aligned slices, random deps, syncs, waits and "
     "a pipelined loop.")
    L = ['buffer D : L2 (size=256)', 'buffer A : L1 (size=64)']
    toks = []
    def sl():
        o = rng.randrange(0, 7) * 8; e = rng.choice([8, 16, 24])
        return f'region(A, {o}, {min(e, 64 - o)}, elem=i8, shape=[{min(e, 64 - o)}], layout=C)'
    def task(k, ind=''):
        deps = rng.sample(toks, min(len(toks), rng.choice([0, 1, 2]))) if toks else []
        if toks and rng.random() < 0.7 and toks[-1] not in deps: deps.append(toks[-1])    # mostly ordered chains
        dep = f', deps=[{", ".join(deps)}]' if deps else ''
        mode = rng.choice(['async', 'sync'])
        if rng.random() < 0.5:
            L.append(f'{ind}t{k} = transfer.{mode}(dst={sl()}, src=region(D, {rng.randrange(0, 8) * 16}, 16){dep})')
        else:
            o = rng.randrange(0, 7) * 8
            L.append(f'{ind}t{k} = relu.{mode} in region(A, {o}, 8, elem=i8, shape=[8], layout=C) out region(A, '
                     f'{rng.randrange(0, 7) * 8}, 8, elem=i8, shape=[8], layout=C)' + (f' deps=[{", ".join(deps)}]' if deps else ''))
        toks.append(f't{k}')
    k = 0
    for _ in range(n):
        r = rng.random()
        if r < 0.1 and toks: L.append(f'wait({rng.choice(toks)})')
        elif r < 0.2:
            L.append(f'loop i in [0..{rng.randrange(1, 6)}] @max_in_flight({rng.randrange(1, 3)}):')
            for _ in range(rng.randrange(1, 3)): task(k, '    '); k += 1
            L.append('endloop')
        else: task(k); k += 1
    return '\n'.join(L) + '\n'

def hazards(src, sim_class, monkeypatch):
    monkeypatch.setattr(hz, 'HazardSim', sim_class)
    r = check(text=src, name='h.nem')
    return sorted((d.rule, d.line, d.col) for d in r.diags if d.rule.startswith('hazard'))

@pytest.mark.parametrize('list_max', [hz.SIM_LIST_MAX, 1])
def test_agrees_with_reference_model(monkeypatch, list_max):
    "Both storage modes of the simulator (a short list; interval indexes, forced with `SIM_LIST_MAX = 1`) agree with the reference."
    monkeypatch.setattr(hz, 'SIM_LIST_MAX', list_max)
    rng = random.Random(1234)
    found = 0
    for case in range(200):
        src = random_program(rng)
        new = hazards(src, hz.HazardSim, monkeypatch)
        ref = hazards(src, ReferenceSim, monkeypatch)
        assert {x[1:] for x in new} == {x[1:] for x in ref}, (case, src, new, ref)
        found += bool(new)
    assert 40 < found < 160, found     # the generator makes both hazardous and clean programs

def chain(n):
    L = ['buffer A : L2 (size=1024)', 'buffer B : L2 (size=1024)', 't0 = transfer.async(dst=region(B, 0, 16), src=region(A, 0, 16))']
    L += [f't{k} = transfer.async(dst=region(B, 0, 16), src=region(A, 0, 16), deps=[t{k-1}])' for k in range(1, n)]
    return '\n'.join(L + [f'wait(t{n-1})']) + '\n'

def independent(n):
    L = [f'buffer A : L2 (size={16*n})', f'buffer B : L2 (size={16*n})']
    L += [f't{k} = transfer.async(dst=region(B, {16*k}, 16), src=region(A, {16*k}, 16))' for k in range(n)]
    return '\n'.join(L + ['wait(' + ', '.join(f't{k}' for k in range(n)) + ')']) + '\n'

@pytest.mark.parametrize('make', [chain, independent])
def test_20000_tasks_linear(make, monkeypatch):
    "Issue #13: a chain of dependent transfers and a run of independent ones, 20,000 tasks each: work per task stays constant."
    sims = []
    class Recording(hz.HazardSim):
        def __init__(self, ctx): super().__init__(ctx); sims.append(self)
    monkeypatch.setattr(hz, 'HazardSim', Recording)
    r = check(text=make(20000), name='big.nem')
    assert r.diags == [] and sims[0].n == 20000
    assert sims[0].work < 10 * 20000, sims[0].work            # comparisons + search steps: a few per task (quadratic: ~2*10**8)

def test_hazards_still_found_in_a_long_chain():
    "One missing dependency in the middle of a 5,000-task chain is found, at its line."
    src = chain(5000).replace('deps=[t2499])', 'deps=[t2400])')   # t2500 no longer waits for t2401..t2499
    src = src.replace('deps=[t2500])', 'deps=[t2500, t2499])')       # (t2501 waits for both again)
    r = check(text=src, name='c.nem')
    assert [(d.rule, d.line) for d in r.errors] == [('hazard.write', 2 + 2500 + 1)]
    assert 'line 2502' in r.errors[0].message          # against t2499, the latest unordered writer

def test_unordered_flood_is_budgeted(monkeypatch):
    "Thousands of mutually unordered writes of the same bytes: the analysis reports, then stops at its work budget with an info."
    monkeypatch.setattr(hz, 'SIM_WORK_BUDGET', 200_000)
    n = 3000
    src = 'buffer A : L2 (size=64)\nbuffer B : L2 (size=64)\n' + ''.join(f't{k} = transfer.async(dst=region(B, 0, 16), src=region(A, '
                                                                         f'0, 16))\n' for k in range(n))
    sims = []
    real = hz.HazardSim.__init__
    def init(self, ctx): real(self, ctx); sims.append(self)
    monkeypatch.setattr(hz.HazardSim, '__init__', init)
    r = check(text=src, name='f.nem')
    assert 'hazard.budget' in r.rules('info') and r.rules().count('hazard.write') > 10
    # the work counted (access comparisons + ordering-search steps) stops growing with n once the budget is spent: past it, each
    # access costs at most one scan of a short pending list (SIM_LIST_MAX entries) and no comparison
    (sim,) = sims
    assert sim.over_budget and sim.work <= 200_000 + n * (hz.SIM_LIST_MAX + 1)
