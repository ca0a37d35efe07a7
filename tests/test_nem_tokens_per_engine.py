"""Each engine's sequencer tracks its own tokens (`SEQ.max_active_tokens` per SEQ instance, one SEQ per engine): the functional
executor, the timing table (statement by statement and in closed form for vectorised loops) and the checker's warning agree on
which programs fit, on the instance that overflows, and on the high-water mark."""
import pytest
from nac_lab.nem.analysis.check import check
from nac_lab.nem.execution.elab import elaborate, load_program
from nac_lab.nem.execution.memory import NemExecError
from nac_lab.nem.timing.table import build_table
from test_nem_exec_sim import dev

def _bufs(eng):
    return ''.join(f'buffer E{e} : L1[{e}] (size=4096)\n' for e in range(eng)) + 'buffer G : L2 (size=4096)\n'

def _moves(counts):
    "counts[e] transfers into L1[e], engines interleaved, each its own token: (lines, line number of the last one)."
    out, k = [], 0
    for i in range(max(counts)):
        for e, n in enumerate(counts):
            if i < n: out.append(f't{k} = transfer.async(dst=region(E{e}, {i * 8}, 8), src=region(G, {i * 8}, 8))'); k += 1
    return '\n'.join(out) + '\n'

def _prog(counts, tok=32, extra=''):
    return dev(eng=len(counts), tok=tok) + _bufs(len(counts)) + _moves(counts) + extra

def _both(src):
    "(elab, table) of `src`, or the NemExecError each raised."
    out = []
    for f in (lambda: elaborate(load_program(src)), lambda: build_table(load_program(src))):
        try: out.append(f())
        except NemExecError as e: out.append(e)
    return out

def test_each_engine_holds_the_limit():
    "32 live tokens on each of 4 engines (128 in all) fit a sequencer of 32 per engine; the high-water mark is 32 in both models."
    src = _prog([32, 32, 32, 32])
    el, tb = _both(src)
    assert el.max_live == tb.max_live == 32 and len(el.insts) == tb.n == 128
    assert 'token.limit' not in {d.rule for d in check(text=src).diags}

@pytest.mark.parametrize('engine', [0, 2, 3])
def test_one_more_on_one_engine_is_refused(engine):
    "A 33rd token on one engine is refused at that task by both models, naming the engine; the checker warns with the engine."
    counts = [32, 32, 32, 32]; counts[engine] += 1
    src = _prog(counts)
    el, tb = _both(src)
    assert isinstance(el, NemExecError) and isinstance(tb, NemExecError)
    last = len(src.splitlines())                           # the 33rd task of the engine is the program's last line
    for e in (el, tb):
        assert e.rule == 'token.limit' and e.line == last and f'33 task tokens would be live on engine {engine}' in str(e)
    w = [d for d in check(text=src).diags if d.rule == 'token.limit']
    assert len(w) == 1 and w[0].severity == 'warning' and f'33 task tokens are live on engine {engine}' in w[0].message

def test_wait_retires_tokens_of_its_engine_only():
    "A wait on engine 1's tokens makes room on engine 1, not on engine 0."
    base = dev(eng=2, tok=4) + _bufs(2) + _moves([4, 4])
    ok = base + 'wait(t1, t3, t5, t7)\nu = transfer.async(dst=region(E1, 64, 8), src=region(G, 0, 8))\n'
    el, tb = _both(ok)
    assert el.max_live == tb.max_live == 4
    bad = base + 'wait(t1, t3, t5, t7)\nu = transfer.async(dst=region(E0, 64, 8), src=region(G, 0, 8))\n'
    el, tb = _both(bad)
    assert all(isinstance(e, NemExecError) and 'live on engine 0' in str(e) for e in (el, tb))

def test_seq_engine_places_an_engine_agnostic_task():
    "An L2 -> L2 copy counts against engine 0, or against the engine `@seq_engine(k)` names."
    cp = lambda k, deco: f'c{k} = transfer.async(dst=region(G, {2048 + k * 8}, 8), src=region(G, {k * 8}, 8)){deco}\n'
    base = dev(eng=2, tok=2) + _bufs(2)
    el, tb = _both(base + cp(0, '') + cp(1, '') + cp(2, ' @seq_engine(1)') + cp(3, ' @seq_engine(1)'))
    assert el.max_live == tb.max_live == 2 and [i.engine for i in el.insts] == [0, 0, 1, 1]
    el, tb = _both(base + cp(0, '') + cp(1, '') + cp(2, ''))
    assert all(isinstance(e, NemExecError) and '3 task tokens would be live on engine 0' in str(e) for e in (el, tb))

@pytest.mark.parametrize('nif, it', [(40, None), (41, 'i=40'), (60, 'i=40')])
def test_pipelined_loop_per_engine_in_closed_form(nif, it):
    ("Two tasks per iteration on two engines under @max_in_flight(nif), 40 tokens per engine: 40 iterations in flight fit (80 "
     "tokens in all); 41 do not, and both models name iteration 40 of the first task.")
    src = dev(eng=2, tok=40) + _bufs(2) + f'''loop i in [0..99] @max_in_flight({nif}):
    t = transfer.async(dst=region(E0, (i mod {nif}) * 8, 8), src=region(G, 0, 8))
    u = transfer.async(dst=region(E1, (i mod {nif}) * 8, 8), src=region(G, 8, 8))
endloop
'''
    el, tb = _both(src)
    if it is None:
        assert el.max_live == tb.max_live == 40
        return
    for e in (el, tb):
        assert isinstance(e, NemExecError) and e.rule == 'token.limit' and e.iteration == it and 'live on engine 0' in str(e)
    assert el.line == tb.line
