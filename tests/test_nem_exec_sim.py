"""Timed simulation: the vectorised timing table against nem.elab's instances, closed-form cycle counts of the
fluid port model, and the bad programs (out of bounds, token limit, deadlock, races) with their iterations."""
import json
import numpy as np
import pytest
from nac_lab.core import data_path
from nac_lab.nem.check import check
from nac_lab.nem.elab import elaborate, load_program
from nac_lab.nem.table import build_table
from nac_lab.nem.sim import simulate, simulate_table, summary, to_json, chrome_trace
from nac_lab.nem.exec import run
from nac_lab.nem.memory import NemExecError

DEV = '''include "nem_baseline_1.0.nem"
device tdev extends nem_baseline_1_0 {{
    topology {{
        num_engines = {eng}
        l2_size_bytes = 1048576
        device_units {{ sDMA = {sdma} WDM = 0 }}
        per_engine {{ NMU = 1 CSTL = {cstl} DMA = {dma} VPU = 1 SEQ = 1 l1_size_bytes = 524288 }}
    }}
    unit_characteristics {{
        NMU {{ int8_macs = 256 fp16_macs = 128 pipeline_cycles = 8 }}
        DMA {{ bytes_per_cycle = 64 latency = 10 l2_bytes_per_cycle = {l2} }}
        sDMA {{ bytes_per_cycle = 64 latency = 20 ddr_bytes_per_cycle = 64 }}
        CSTL {{ elems_per_cycle = 64 latency = 4 }}
        SEQ {{ max_active_tokens = {tok} }}
    }}
    opcode.mandatory {{ gemm.float<bf16>.no_bias eltwise<bf16>.default }}
}}
program t:
'''
def dev(eng=1, sdma=2, cstl=2, dma=2, l2=1024, tok=64): return DEV.format(eng=eng, sdma=sdma, cstl=cstl, dma=dma, l2=l2, tok=tok)

def same(text):
    cr = load_program(text); el = elaborate(cr); tb = build_table(cr)
    assert [i.name for i in el.insts] == [tb.name(j) for j in range(tb.n)]
    assert [sorted(i.deps) for i in el.insts] == [sorted(tb.deps(j).tolist()) for j in range(tb.n)]
    assert [(i.unit, i.pin) for i in el.insts if i.kind != 'join'] == [(tb.pools[tb.pool[j]][1], int(tb.pin[j])) for j in range(tb.n) if tb.kind[j]]
    assert el.max_live == tb.max_live
    return tb

NESTED = dev(eng=2, cstl=4) + '''buffer A : L2 (size=8192)
buffer S : L1[1] (size=1024)
buffer D : L1[1] (size=1024)
tw = transfer.async(dst=region(S, 512, 256), src=region(A, 0, 256))
loop j in [0..2]:
    loop i in [0..5] @max_in_flight(3):
        let s = (i mod 3) * 128
        let a = region(S, s, 128, elem=bf16, shape=[64], layout=C)
        let y = region(D, s, 128, elem=bf16, shape=[64], layout=C)
        tx = transfer.async(dst=a, src=region(A, (j * 6 + i) * 128, 128))
        tr = relu.async in a out y deps=[tx, tw] @resource(CSTL[i mod 4])
        ts = store.async(dst=region(A, 2048 + (j * 6 + i) * 128, 128), src=y, deps=[tr])
    endloop
endloop
wait(ts)
'''

def test_table_equals_elab_vectorised_and_scalar():
    tb = same(NESTED)                                          # innermost loop vectorised, outer scalar
    assert tb.pools[tb.pool[int(np.flatnonzero(tb.kind)[0])]] == (1, 'DMA')    # L1[1] places the task on engine 1
    same(NESTED.replace('        ts = store.async', '        wait(tr)\n        ts = store.async'))   # a wait: not vectorised
    same(NESTED.replace('tr = relu.async', 'tr = relu.sync'))                                     # a sync task: not vectorised
    same(data_path('nem', 'examples', 'conv2d_relu_fixed.nem').read_text().replace('include "../devices', f'include "{data_path("nem", "devices")}'))

def test_closed_form_contention_unequal_sizes():
    "Two DDR->L2 moves of 3200 and 6400 bytes share a 64 B/cycle DDR port: 32 each until the first is done (100 cycles), then 64."
    body = '''buffer A : DDR (size=9600)
buffer B : L2 (size=9600)
t0 = transfer.async(dst=region(B, 0, 3200), src=region(A, 0, 3200))
t1 = transfer.async(dst=region(B, 3200, 6400), src=region(A, 3200, 6400))
wait(t0, t1)
'''
    r = simulate(dev() + body)
    assert r.end[0] == 100 + 20 and r.end[1] == 100 + (6400 - 3200) / 64 + 20
    assert r.total_cycles == 170

def test_closed_form_l2_port_shared_by_dma():
    "Four 4096-byte L2->L1 transfers on 4 DMAs with a 128 B/cycle L2 port: each gets 32 B/cycle: 10 + 4096/32."
    body = 'buffer A : L2 (size=16384)\nbuffer B : L1[0] (size=16384)\n' + ''.join(
        f't{k} = transfer.async(dst=region(B, {k * 4096}, 4096), src=region(A, {k * 4096}, 4096))\n' for k in range(4)) + 'wait(t0, t1, t2, t3)\n'
    assert simulate(dev(dma=4, l2=128) + body).total_cycles == 10 + 4096 // 32
    assert simulate(dev(dma=4, l2=1024) + body).total_cycles == 10 + 4096 // 64

def test_pipeline_steady_state_long():
    "A 200-tile double-buffered pipeline (vectorised) keeps max(transfer, compute) per tile."
    T = 200
    body = f'''buffer A : L2 (size={T * 2048})
buffer S : L1[0] (size=4096)
buffer D : L1[0] (size=4096)
loop i in [0..{T - 1}] @max_in_flight(2):
    let a = region(S, (i mod 2) * 2048, 2048, elem=bf16, shape=[1024], layout=C)
    let y = region(D, (i mod 2) * 2048, 2048, elem=bf16, shape=[1024], layout=C)
    tx = transfer.async(dst=a, src=region(A, i * 2048, 2048))
    tc = relu.async in a out y deps=[tx]
endloop
'''
    tx, tc = 10 + 2048 // 64, 1024 // 64 + 4
    r = simulate(dev(dma=1, cstl=1) + body)
    assert r.total_cycles == min(tx, tc) + T * max(tx, tc)
    s = summary(r)
    assert s['units']['E0.DMA[0]']['busy'] == T * tx
    assert s['bytes']['L2']['read'] == T * 2048 and s['bytes']['L1[0]']['written'] == T * 2048 + T * 2048

def test_json_and_trace_shapes():
    r = simulate(data_path('nem', 'examples', 'conv2d_relu_fixed.nem'))
    d = to_json(r)
    assert {'total_cycles', 'units', 'tasks'} <= set(d) and isinstance(d['total_cycles'], int)
    assert [t['name'] for t in d['tasks'][:4]] == ['tw', 'tb', 'tx[0]', 'tc[0]']
    assert all({'name', 'iteration', 'unit', 'start', 'end'} <= set(t) for t in d['tasks'])
    tr = json.loads(json.dumps(chrome_trace(r)))
    xs = [e for e in tr['traceEvents'] if e['ph'] == 'X']
    assert len(xs) == 18 and all(e['dur'] >= 0 and e['ts'] >= 0 for e in xs)

# --- bad programs ---------------------------------------------------------------------------------------
def test_out_of_bounds_in_loop_names_iteration():
    body = '''buffer A : L2 (size=1000)
buffer S : L1[0] (size=256)
loop i in [0..14]:
    tx = transfer.async(dst=region(S, 0, 128), src=region(A, ((i / 5) mod 2) * 900, 128))
endloop
'''
    src = dev() + body
    line = src.split('\n').index('    tx = transfer.async(dst=region(S, 0, 128), src=region(A, ((i / 5) mod 2) * 900, 128))') + 1
    sampled = check(text=src).ok          # the checker evaluates a loop's first and last iterations; i = 5..9 read [900, 1028)
    for f in (lambda: build_table(load_program(src)), lambda: elaborate(load_program(src))):
        with pytest.raises(NemExecError, match='region.bounds') as e: f()
        assert e.value.line == line and (e.value.iteration == 'i=5' or not sampled)

def test_token_limit_same_in_table_and_elab():
    body = '''buffer A : L2 (size=64)
buffer B : L1[0] (size=512)
loop i in [0..99] @max_in_flight(50):
    t = transfer.async(dst=region(B, (i mod 50) * 4, 4), src=region(A, 0, 4))
    u = transfer.async(dst=region(B, 256 + (i mod 50) * 4, 4), src=region(A, 0, 4))
endloop
'''
    src = dev(tok=40) + body
    msgs = []
    for f in (lambda: build_table(load_program(src)), lambda: elaborate(load_program(src))):
        with pytest.raises(NemExecError, match='token.limit') as e: f()
        msgs.append((e.value.iteration, e.value.line))
    assert msgs[0] == msgs[1] and msgs[0][0] == 'i=20'      # 2 tasks per iteration, 40 tokens: the 41st is t of iteration 20

def test_deadlock_without_sdma():
    body = 'buffer A : DDR (size=64)\nbuffer B : L2 (size=64)\nt = transfer.sync(dst=B, src=A)\n'
    with pytest.raises(NemExecError, match='deadlock.*no sDMA'): simulate(dev(sdma=0) + body)

def test_race_between_iterations_reported():
    "Slots rotate mod 3 with @max_in_flight(3), except that for i in 10..19 slot 2 folds onto slot 1: check passes, run refuses."
    body = '''buffer A : L2 (size=960)
buffer Y : L2 (size=960)
buffer S : L1[0] (size=96)
buffer T : L1[0] (size=96)
loop i in [0..29] @max_in_flight(3):
    let s = (i mod 3) - ((i / 10) mod 2) * ((i mod 3) / 2)
    let a = region(S, s * 32, 32, elem=f32, shape=[8], layout=C)
    let y = region(T, s * 32, 32, elem=f32, shape=[8], layout=C)
    tx = transfer.async(dst=a, src=region(A, i * 32, 32))
    tr = relu.async in a out y deps=[tx]
    ts = store.async(dst=region(Y, i * 32, 32), src=y, deps=[tr])
endloop
wait(ts)
'''
    with pytest.raises(NemExecError, match='hazard') as e: run('program r:\n' + body, dict(A=np.zeros(240, np.float32)))
    if check(text='program r:\n' + body).ok:       # the checker samples iterations; the executor sees every one
        assert e.value.rule == 'hazard.race' and e.value.iteration == 'i=11'
    # the same program with the fold removed runs
    ok = body.replace('let s = (i mod 3) - ((i / 10) mod 2) * ((i mod 3) / 2)', 'let s = i mod 3')
    x = np.random.default_rng(0).standard_normal(240).astype(np.float32)
    assert (run('program r:\n' + ok, dict(A=x))['Y'].view(np.float32) == np.maximum(x, 0)).all()

def test_huge_loops_refused_without_allocating():
    body = 'buffer A : L2 (size=64)\nbuffer B : L1[0] (size=64)\nloop i in [0..999999999999]:\n    t = transfer.async(dst=region(B, 0, 4), src=region(A, 0, 4))\nendloop\n'
    with pytest.raises(NemExecError, match='exec.limit'): build_table(load_program(dev() + body))
    with pytest.raises(NemExecError, match='exec.limit'): run('program h:\nbuffer A : DDR (size=1099511627776)\n', {})
    with pytest.raises(NemExecError, match='exec.limit'): run(dev() + body, {})

def test_mac_array_cycles_from_fxp(tmp_path):
    "With NMU { array_rows array_cols }, a conv costs nac_lab.fxp's array cycles: 196x576 @ 576x128 on 64x64 -> 4*2 tiles * 576 + 8."
    d = tmp_path / 'arr.nem'
    d.write_text(f'include "{data_path("nem", "devices", "npm_lite.nem")}"\ndevice arr extends npm_lite {{\n'
                 '    unit_characteristics { NMU { array_rows = 64 array_cols = 64 } }\n}\n')
    r = simulate(data_path('nem', 'examples', 'conv2d_relu_fixed.nem'), device=str(d))
    tb = r.table
    tc = [j for j in range(tb.n) if tb.name(j) == 'tc[0]'][0]
    assert r.end[tc] - r.start[tc] == 4 * 2 * 576 + 8
    plain = simulate(data_path('nem', 'examples', 'conv2d_relu_fixed.nem'))
    j = [j for j in range(plain.table.n) if plain.table.name(j) == 'tc[0]'][0]
    assert plain.end[j] - plain.start[j] == 196 * 128 * 576 // 4096 + 8

def test_program_order_and_pinning():
    "Ready tasks compete in program order; a pinned task waits for its instance even when another is free."
    regs = ''.join(f'a{k} = region(S, {k * 128}, 128, elem=bf16, shape=[64], layout=C)\ny{k} = region(D, {k * 128}, 128, elem=bf16, shape=[64], layout=C)\n' for k in range(4))
    body = 'buffer S : L1[0] (size=512) @import\nbuffer D : L1[0] (size=512)\n' + regs
    d = 64 // 64 + 4                                      # 64 elements on 64 lanes + latency 4
    r = simulate(dev(cstl=1) + body + ''.join(f'r{k} = relu.async in a{k} out y{k}\n' for k in range(3)))
    assert r.start[:3].tolist() == [0, d, 2 * d]
    r = simulate(dev(cstl=2) + body + 'r0 = relu.async in a0 out y0\n    @resource(CSTL[1])\nr1 = relu.async in a1 out y1\n    @resource(CSTL[1])\nr2 = relu.async in a2 out y2\n')
    assert [r.label(j) for j in range(3)] == ['E0.CSTL[1]', 'E0.CSTL[1]', 'E0.CSTL[0]'] and r.start[:3].tolist() == [0, d, 0]
