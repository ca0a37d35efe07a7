"""Property tests of the MMAP scheduler, simulator and reordering pass on random instruction graphs.

Expected values are computed here by brute force from the definitions (nac_lab.nac.schedule.mmap §"Liveness"), not by the
code under test: the readers of a value are found by scanning every instruction, and live bytes by testing every
(value, tick) pair.
"""
from nac_lab.nac.schedule.mmap import read_checked
import random
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from nac_lab.nac.format import Instruction, MmapAction as A, NacFile, read_nac, write_nac, FormatError
from nac_lab.nac.schedule.mmap import (build_schedule, commands_of, to_records, mmap_violations, check_mmap,
                              lower_bound, reorder, Command, ScheduleError, MmapError, make_record)
from nac_lab.nac.schedule.mmap_sim import simulate, demo_nac


def random_graph(seed, n_max=80):
    "A random valid stream: host inputs, parameters placed anywhere, ops reading 1-3 earlier values, one final output."
    rng = random.Random(seed)
    n = rng.randint(3, n_max)
    ops, values, kinds = [], [], []
    for i in range(n - 1):
        r = rng.random()
        if i == 0 or r < 0.08:
            ops.append(Instruction.user_input()); kinds.append('input')
        elif r < 0.35:
            ops.append(Instruction.param(len(ops) + 1)); kinds.append('param')
        else:
            k = rng.randint(1, min(3, len(values)))
            window = values[-rng.choice([2, 4, 12, 1000]):]
            srcs = rng.sample(window, min(k, len(window)))
            ops.append(Instruction(20 + rng.randint(0, 5), 1, [], [s - i for s in srcs])); kinds.append('op')
        values.append(i)
    outs = sorted({n - 2} | set(rng.sample(range(n - 1), min(2, n - 1))))
    outs = [o for o in outs if kinds[o] != 'param'] or [n - 2]
    ops.append(Instruction.output([o - (n - 1) for o in outs])); kinds.append('output')
    sizes = [0 if k == 'output' else rng.choice([0, 4, 16, 64, 256, 1024]) for k in kinds]
    return ops, sizes, kinds


def brute_readers(ops):
    n = len(ops)
    return [[i for i in range(n) if ops[i].A != 2 and any(d and i + d == v for d in ops[i].D)] for v in range(n)]


def brute_next(ops, v):
    "The first instruction after v that is not a parameter load (decision NAC 10: FORWARD skips parameter loads)."
    k = v + 1
    while k < len(ops) and ops[k].A == 2 and ops[k].B == 1: k += 1
    return k


def brute_live(ops, sizes):
    n = len(ops); rd = brute_readers(ops); out = []
    for t in range(n):
        tot = 0
        for v in range(n):
            ins = ops[v]
            if ins.A == 3: continue
            if ins.A == 2 and ins.B == 1:           # decision NAC 10: preloaded on the tick before its load instruction at the latest
                if rd[v] and max(v - 1, 0) <= t <= rd[v][-1]: tot += sizes[v]
            elif v <= t <= (rd[v][-1] if rd[v] else v): tot += sizes[v]
        out.append(tot)
    return out


SEEDS = st.integers(0, 2**32 - 1)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(SEEDS, st.integers(0, 6))
def test_schedule_valid_and_minimal(seed, ahead):
    ops, sizes, kinds = random_graph(seed)
    lb = max(brute_live(ops, sizes))
    assert lower_bound(ops, sizes)[0] == lb
    for kw in ({}, {'sizes': sizes}):
        recs = build_schedule(ops, preload_ahead=ahead, **kw)
        assert mmap_violations(recs, ops) == []
        rep = simulate(ops, recs, sizes)
        assert rep.valid, [str(v) for v in rep.violations]
        assert rep.lower_bound == lb
        if kw or ahead == 0: assert rep.peak_bytes == lb          # budget = lower bound, or no prefetch
        else: assert rep.peak_bytes >= lb
        assert rep.leaks == []


@FAST
@given(SEEDS)
def test_commands_match_definitions(seed):
    ops, sizes, kinds = random_graph(seed)
    n = len(ops); rd = brute_readers(ops)
    cmds = commands_of(build_schedule(ops, preload_ahead=3))
    got = {(c.action, c.target): c.tick for c in cmds}
    assert len(got) == len(cmds)                                   # no duplicates
    exp = {}
    for v in range(n):
        if kinds[v] == 'output' or not rd[v]: continue
        if kinds[v] == 'param':
            if v: exp[(A.PRELOAD, v)] = max(0, v - 3)           # before the load instruction; a load at 0 loads itself
        elif rd[v] == [brute_next(ops, v)]:
            exp[(A.FORWARD, rd[v][0])] = v; continue
        else: exp[(A.SAVE_RESULT, v)] = v
        if rd[v][-1] + 1 < n: exp[(A.FREE, v)] = rd[v][-1] + 1
    assert got == exp


@FAST
@given(SEEDS, st.integers(0, 4), st.integers(0, 3000))
def test_capacity_is_respected_or_refused(seed, ahead, extra):
    ops, sizes, kinds = random_graph(seed)
    lb = max(brute_live(ops, sizes))
    recs = build_schedule(ops, preload_ahead=ahead, sizes=sizes, capacity=lb + extra)
    rep = simulate(ops, recs, sizes, capacity=lb + extra)
    assert rep.valid and rep.peak_bytes <= lb + extra
    pre = {c.target: c.tick for c in commands_of(recs) if c.action == A.PRELOAD}
    rd = brute_readers(ops)
    assert all(p - max(ahead, 1) <= t <= p - 1 for p, t in pre.items())   # delayed, never dropped, always before the load
    assert set(pre) == {v for v in range(1, len(ops)) if kinds[v] == 'param' and rd[v]}
    if lb > 0:
        with pytest.raises(ScheduleError, match='below'):
            build_schedule(ops, sizes=sizes, capacity=lb - 1)


@FAST
@given(SEEDS, st.data())
def test_every_needed_command_is_needed(seed, data):
    "Dropping any non-FREE command, or moving a FREE one tick earlier, makes the schedule invalid."
    ops, sizes, kinds = random_graph(seed)
    cmds = commands_of(build_schedule(ops))
    if not cmds: return
    c = data.draw(st.sampled_from(cmds))
    if c.action == A.FREE:
        mutated = [Command(x.tick - 1, x.action, x.target) if x == c else x for x in cmds]
    else:
        mutated = [x for x in cmds if x != c]
    rep = simulate(ops, to_records(mutated), sizes)
    assert not rep.valid


@FAST
@given(SEEDS)
def test_reorder_is_a_valid_permutation_and_not_worse(seed):
    ops, sizes, kinds = random_graph(seed)
    new_ops, order, before, after = reorder(ops, sizes)
    assert sorted(order) == list(range(len(ops)))
    assert after <= before == max(brute_live(ops, sizes))
    pos = {o: p for p, o in enumerate(order)}
    for p, o in enumerate(order):                                   # same edges, renumbered
        assert new_ops[p].A == ops[o].A and new_ops[p].B == ops[o].B and new_ops[p].C == ops[o].C
        assert sorted(p + d for d in new_ops[p].D if d) == sorted(pos[o + d] for d in ops[o].D if d)
    hosts = [pos[i] for i in range(len(ops)) if kinds[i] == 'input']
    assert hosts == sorted(hosts)                                   # user inputs keep their order
    assert order[-1] == len(ops) - 1                                # <OUTPUT B=0> stays last
    new_sizes = [sizes[o] for o in order]
    assert max(brute_live(new_ops, new_sizes)) == after
    rep = simulate(new_ops, build_schedule(new_ops, sizes=new_sizes), new_sizes)
    assert rep.valid and rep.peak_bytes == after


def test_reorder_helps_on_branches():
    "k independent big branches reduced by small ops: source order holds all of them, the greedy order one."
    k = 6; ops = [Instruction.user_input()]; sizes = [8]
    for b in range(k): ops.append(Instruction(40, 1, [], [-(b + 1)])); sizes.append(1000)
    for b in range(k): ops.append(Instruction(41, 1, [], [-k])); sizes.append(8)
    red = [k + 1 + b for b in range(k)]; acc = red[0]
    for b in range(1, k):
        i = len(ops); ops.append(Instruction(11, 1, [], [acc - i, red[b] - i])); sizes.append(8); acc = i
    ops.append(Instruction.output([-1])); sizes.append(0)
    new_ops, order, before, after = reorder(ops, sizes)
    assert before >= k * 1000 and after < 2 * 1000 + 100


def test_file_round_trip_and_reader_errors(tmp_path):
    nac, sizes = demo_nac()
    data = write_nac(nac)
    back = read_nac(data)
    assert [(r.tick, list(r.commands)) for r in back.mmap] == [(r.tick, list(r.commands)) for r in nac.mmap]
    check_mmap(back, section_offset=back.sections['MMAP'][0])
    off = back.sections['MMAP'][0]
    # unknown action code in the first command (record head is 3 bytes after the 8-byte tag + count)
    bad = bytearray(data); bad[off + 8 + 3] = 99
    with pytest.raises(FormatError, match='unknown action code 99'): read_nac(bytes(bad))
    # tick beyond OPS
    bad = bytearray(data); bad[off + 8:off + 10] = (500).to_bytes(2, 'little')
    with pytest.raises(FormatError, match='tick 500'): read_nac(bytes(bad))
    # semantic: PRELOAD of an op, raised by check_mmap with the command's byte offset
    back.mmap[0] = make_record(back.mmap[0].tick, [(A.PRELOAD, 2)])
    with pytest.raises(MmapError) as ei: check_mmap(back, section_offset=off)
    assert ei.value.offset == off + 8 + 3 and 'PRELOAD target must be an <INPUT B=1>' in str(ei.value)


def test_read_nac_check_mmap_is_strict_and_opt_in(tmp_path):
    """read_checked(...) raises MmapError naming record, tick and the command's byte offset for a
    PRELOAD of an op; a tick beyond OPS is an MmapError with or without it; read_nac stays lenient."""
    nac, _ = demo_nac()
    p = tmp_path / 'demo.nac'; p.write_bytes(write_nac(nac))
    assert read_checked(p).mmap                  # the scheduler's own schedule passes
    data = p.read_bytes(); off = read_nac(p).sections['MMAP'][0]
    # record 0: tick (2 bytes) + count (1) at off + 8, its first command's action at off + 11, target at off + 12
    assert data[off + 11] in (10, 40)
    op = next(i for i, ins in enumerate(nac.ops) if ins.A not in (2, 3))        # a regular op, not <INPUT B=1>
    bad = bytearray(data); bad[off + 11] = 40; bad[off + 12:off + 14] = op.to_bytes(2, 'little')
    lenient = read_nac(bytes(bad))                              # default behaviour unchanged
    assert (int(lenient.mmap[0].commands[0].action), lenient.mmap[0].commands[0].target) == (40, op)
    with pytest.raises(MmapError) as ei: read_checked(bytes(bad))
    e = ei.value
    assert e.offset == off + 11 and e.section == f'MMAP record 0 (tick {lenient.mmap[0].tick})'
    assert 'PRELOAD target must be an <INPUT B=1>' in str(e) and f'offset {off + 11:#x}' in str(e)
    # tick beyond OPS (record 0's tick field)
    bad = bytearray(data); bad[off + 8:off + 10] = (len(nac.ops) + 5).to_bytes(2, 'little')
    for strict in (False, True):
        with pytest.raises(MmapError) as ei: (read_checked if strict else read_nac)(bytes(bad))
        assert ei.value.offset == off + 8 and ei.value.section == 'MMAP record 0'
        assert f'tick {len(nac.ops) + 5} has no instruction' in str(ei.value)
    # decreasing ticks are well-formed bytes: only the strict reader rejects them
    recs = read_nac(p).mmap
    nac.mmap = [recs[1], recs[0]] + recs[2:]
    swapped = write_nac(nac)
    read_nac(swapped)
    with pytest.raises(MmapError, match='ticks must not decrease'): read_checked(swapped)


def test_more_than_255_commands_at_a_tick_survive_the_file():
    nac, _ = demo_nac(schedule=False)
    ops = [Instruction.user_input()] + [Instruction.param(k + 1) for k in range(300)] + [Instruction(240, 1, [],
                                                                                                     [-300 + k for k in range(300)])]
    recs = build_schedule(ops, preload_ahead=400)             # every PRELOAD at tick 0 (before its load instruction)
    assert [(r.tick, len(r.commands)) for r in recs] == [(0, 255), (0, 45)]
    assert sorted(c.target for c in commands_of(recs)) == list(range(1, 301))


class _RawCmd:
    def __init__(self, action, target): self.action, self.target = action, target


class _RawRec:
    def __init__(self, tick, commands): self.tick, self.commands = tick, commands


@settings(max_examples=300, deadline=None)
@given(SEEDS, st.lists(st.tuples(st.integers(0, 90), st.lists(st.tuples(st.sampled_from([10, 20, 30, 40, 0, 99]),
                                                                        st.integers(0, 90)), max_size=5)), max_size=12))
def test_checker_never_crashes_on_arbitrary_records(seed, raw):
    "Any records (bad ticks, codes, targets, order) give violations, never an exception."
    ops, sizes, kinds = random_graph(seed, 40)
    recs = [_RawRec(t, [_RawCmd(a, x) for a, x in cs]) for t, cs in raw]
    vs = mmap_violations(recs, ops)
    rep = simulate(ops, recs, sizes, capacity=100, bandwidth=8)
    assert all(v.why for v in rep.violations)
    if any(a in (0, 99) for _, cs in raw for a, _ in cs): assert not rep.valid


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_mutated_mmap_bytes_give_format_errors_or_reports(seed):
    "Byte flips inside the MMAP section: the reader raises a FormatError, or the checker reports; nothing else."
    nac, sizes = demo_nac()
    data = bytearray(write_nac(nac))
    off, size = read_nac(bytes(data)).sections['MMAP']
    rng = random.Random(seed)
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(off + 4, off + size)] = rng.randrange(256)
    try: back = read_nac(bytes(data))
    except FormatError: return
    rep = simulate(back, sizes=sizes)
    assert isinstance(rep.valid, bool)


def _command_offsets(data):
    "{(tick, action code, target): byte offset of the command} of a file's MMAP section, found by walking its bytes."
    off = read_nac(bytes(data)).sections['MMAP'][0]
    n = int.from_bytes(data[off + 4:off + 8], 'little'); pos = off + 8; out = {}
    for _ in range(n):
        t, k = int.from_bytes(data[pos:pos + 2], 'little'), data[pos + 2]
        for j in range(k):
            c = pos + 3 + 3 * j
            out[t, data[c], int.from_bytes(data[c + 1:c + 3], 'little')] = c
        pos += 3 + 3 * k
    return out


def test_cli_check_lists_hand_corrupted_commands_precisely(tmp_path):
    """`schedule check --json` on hand-patched bytes of the demo file (readers [[2, 8], [2], [4], [4], [5], [7], [7],
    [8], [9], []]). A wrong FORWARD must not make the right FORWARD after it a 'duplicate' (review fix)."""
    import json
    from nac_lab.cli import run_cli
    nac, sizes = demo_nac()
    data = bytearray(write_nac(nac)); at = _command_offsets(data)
    def check(name, patches, *extra):
        b = bytearray(data)
        for pos, raw in patches: b[pos:pos + len(raw)] = raw
        (tmp_path / name).write_bytes(bytes(b))
        rc, out, err = run_cli('schedule', 'check', str(tmp_path / name), '--sizes', json.dumps(sizes), '--json', *extra)
        d = json.loads(out)
        return rc, [(v['tick'], v['command'], v['target']) for v in d['violations']], d
    # FORWARD 7 -> 8 rewritten as 7 -> 9: 9 is not the next instruction; value 7 then reaches nobody
    c = at[7, 30, 8]
    rc, vs, d = check('fwd.nac', [(c + 1, (9).to_bytes(2, 'little'))])
    assert rc == 1 and vs == [(7, 'FORWARD', 9), (8, 'EXEC', 7)]
    assert d['violations'][0]['offset'] == c and 'next instruction 8' in d['violations'][0]['why']
    # PRELOAD -> 6 (W2, at tick 5: just in time, decision NAC 10) rewritten as PRELOAD -> 5 (relu, an op): static error,
    # then W2 is read without a preload
    c = at[5, 40, 6]
    rc, vs, d = check('pre.nac', [(c + 1, (5).to_bytes(2, 'little'))])
    assert rc == 1 and vs == [(5, "PRELOAD", 5), (7, "EXEC", 6), (8, "FREE", 6)]
    assert 'must be an <INPUT B=1>' in d['violations'][0]['why']
    # FREE -> 0 moved from tick 9 to tick 8 (x's last reader): the record at tick 9 holds only that FREE
    rec = at[9, 20, 0] - 3
    rc, vs, d = check('free.nac', [(rec, (8).to_bytes(2, 'little'))])
    assert rc == 1 and (8, 'FREE', 0) in vs and 'FREE belongs on tick 9' in d['violations'][vs.index((8, 'FREE', 0))]['why']
    # the untouched file with a capacity below the 4672 B peak (decision NAC 10: weights arrive the tick before their load):
    # tick 2: W1 4096 + b1 256 (preloaded for instruction 3) + x 64 + x@W1 256; tick 5: W2 4096 (preloaded for
    # instruction 6) + x 64 + the value forwarded into 5 (256) + relu 256; tick 7: x 64 + relu 256 + W2 4096 + y 64 = 4480
    rc, vs, d = check('ok.nac', [], '--capacity', '4671')
    assert rc == 1 and vs == [(2, 'CAPACITY', None), (5, 'CAPACITY', None)] and d['peak_bytes'] == 4672
    rc, vs, d = check('ok.nac', [], '--capacity', '4479')
    assert rc == 1 and (7, 'CAPACITY', None) in vs
    rc, vs, d = check('ok.nac', [], '--capacity', '4672')
    assert rc == 0 and vs == []


def test_files_laid_out_the_old_way_still_schedule_and_run():
    """A stream with every parameter load at the top (the layout before decision NAC 10's revision) still schedules,
    simulates valid at the lower bound of its own order and runs to the same outputs as the just-in-time layout."""
    import torch
    from nac_lab.nac.schedule.mmap import apply_order
    from nac_lab.nac.runtime.run import Interpreter
    nac, sizes = demo_nac()
    order = [1, 3, 6, 0, 2, 4, 5, 7, 8, 9]                       # W1, b1, W2 first, then the rest in source order
    old = NacFile(**{k: getattr(nac, k) for k in ('n_inputs', 'n_outputs', 'd_model', 'cmap', 'constants', 'perm', 'param_names',
                                                  'tensors')})
    old.ops = apply_order(nac, order); old.input_names = {3: 'x'}
    osz = [sizes[o] for o in order]
    old.mmap = build_schedule(old, sizes=osz)
    assert all(c.tick < c.target for c in commands_of(old.mmap) if c.action == A.PRELOAD)
    rep = simulate(old, sizes=osz)
    assert rep.valid and rep.peak_bytes == rep.lower_bound == max(brute_live(old.ops, osz))
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    back = read_nac(write_nac(old))
    torch.testing.assert_close(Interpreter(back).run(x)[0], Interpreter(nac).run(x)[0], rtol=0, atol=0)
