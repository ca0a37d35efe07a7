"""Every zoo model: the MMAP schedule compile() writes into the saved file is valid, meets the lower bound for sizes
from a real interpreter run and survives the interpreter-coupled run; compile()'s own value sizes equal the run's; a
schedule built from run sizes does the same; the file round-trips with its schedule; `nac-lab schedule check`
accepts it; reordering never makes the bound worse; dynamic-batch files are minimal at the example batch."""
from nac_lab.nac.schedule.mmap import read_checked
import json, warnings
import pytest

torch = pytest.importorskip('torch')
from nac_lab.nac.compiler.zoo import zoo_names, build_model, example_inputs
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.nac.format import read_nac, MmapAction as A
from nac_lab.nac.schedule.mmap import build_schedule, mmap_violations, commands_of, reorder, lower_bound, Command, to_records
from nac_lab.nac.schedule.mmap_sim import simulate, sizes_from_run, coupled_check, without_frees
from nac_lab.cli import run_cli


@pytest.fixture(scope='module', params=zoo_names())
def zoo(request):
    warnings.filterwarnings('ignore')
    name = request.param
    m = nac_compile(build_model(name), example_inputs(name))
    xs = example_inputs(name)
    return name, m, xs, sizes_from_run(m, *xs)


def test_compiler_schedule_is_valid(zoo):
    name, m, xs, sz = zoo
    assert len(m.nac.mmap) > 0
    assert mmap_violations(m.nac.mmap, m.nac) == []
    rep = simulate(m.nac, sizes=sz)
    assert rep.valid, [str(v) for v in rep.violations[:5]]
    assert rep.peak_bytes >= rep.lower_bound
    assert coupled_check(m, *xs).ok


def test_parameter_loads_are_just_in_time(zoo):
    """decision NAC 10: every <INPUT B=1> sits right before its first reader (only other parameter loads between them),
    every PRELOAD comes at a tick before its load instruction, each parameter is preloaded once, and the schedule's
    peak equals the lower bound."""
    name, m, xs, sz = zoo
    ops = m.nac.ops
    readers = {}
    for i, ins in enumerate(ops):
        if ins.A == 2: continue
        for d in set(ins.D if ins.A != 7 else []):
            if d < 0: readers.setdefault(i + d, []).append(i)
    params = [i for i, ins in enumerate(ops) if ins.A == 2 and ins.B == 1]
    assert params
    for p in params:
        first = min(readers[p])
        assert p < first and all(ops[k].A == 2 and ops[k].B == 1 for k in range(p + 1, first)), (name, p, first)
    pre = [c for c in commands_of(m.nac.mmap) if c.action == A.PRELOAD]
    assert all(c.tick < c.target for c in pre), (name, [c for c in pre if c.tick >= c.target][:3])
    assert sorted(c.target for c in pre) == [p for p in params if p > 0]
    rep = simulate(m.nac, sizes=sz)
    assert rep.valid and rep.peak_bytes == rep.lower_bound, (name, rep.peak_bytes, rep.lower_bound)


def test_compiler_sizes_match_a_real_run(zoo):
    """The sizes compile() derives from the exported graph's metadata are the bytes the interpreter really
    produces at the example batch (parameters: stored size, which is float32 here)."""
    name, m, xs, sz = zoo
    assert m.value_sizes is not None and sz.sum() > 0
    assert list(m.value_sizes) == list(sz)


def test_saved_schedule_meets_lower_bound(zoo, tmp_path):
    """Issue 5: the schedule compile() writes into the file, read back from disk, is valid, its peak equals
    the lower bound for sizes measured by a real interpreter run, and it survives the interpreter-coupled run."""
    name, m, xs, sz = zoo
    back = read_checked(m.save(tmp_path / f'{name}.nac'))
    assert len(back.mmap) > 0
    rep = simulate(back, sizes=sz)
    assert rep.valid, [str(v) for v in rep.violations[:5]]
    assert rep.peak_bytes == rep.lower_bound == lower_bound(back, sz)[0], (name, rep.peak_bytes, rep.lower_bound)
    assert simulate(back, without_frees(back.mmap), sz).peak_bytes >= rep.peak_bytes
    cr = coupled_check(m, *xs, records=back.mmap)
    assert cr.ok and cr.reads > 0


def test_sized_schedule_meets_lower_bound_and_runs(zoo):
    name, m, xs, sz = zoo
    recs = build_schedule(m.nac, sizes=sz)
    rep = simulate(m.nac, recs, sz)
    assert rep.valid and rep.peak_bytes == rep.lower_bound == lower_bound(m.nac, sz)[0]
    assert simulate(m.nac, without_frees(recs), sz).peak_bytes >= rep.peak_bytes
    cr = coupled_check(m, *xs, records=recs)
    assert cr.ok and cr.reads > 0
    # a tighter budget between the bound and the default peak is respected too
    cap = rep.lower_bound
    assert simulate(m.nac, build_schedule(m.nac, sizes=sz, capacity=cap, preload_ahead=8), sz, capacity=cap).valid


def test_broken_schedule_is_caught_by_both_checks(zoo):
    name, m, xs, sz = zoo
    cs = commands_of(m.nac.mmap)
    frees = [c for c in cs if c.action == A.FREE]
    victim = frees[len(frees) // 2]
    bad = to_records([Command(c.tick - 1, c.action, c.target) if c == victim else c for c in cs])
    rep = simulate(m.nac, bad, sz)
    assert not rep.valid and any(v.command == 'FREE' and v.target == victim.target for v in rep.violations)
    cr = coupled_check(m, *xs, records=bad)
    assert not cr.ok and any(v.target == victim.target for v in cr.violations)


def test_round_trip_and_cli(zoo, tmp_path):
    name, m, xs, sz = zoo
    p = m.save(tmp_path / f'{name}.nac')
    back = read_nac(p)
    assert [(r.tick, list(r.commands)) for r in back.mmap] == [(r.tick, list(r.commands)) for r in m.nac.mmap]
    rc, out, err = run_cli('schedule', 'check', str(p), '--json', '--sizes', json.dumps([int(b) for b in sz]))
    d = json.loads(out)
    assert rc == 0 and d['valid'] and d['sizes_note'] is None


def test_reorder_never_worse(zoo):
    name, m, xs, sz = zoo
    ops, order, before, after = reorder(m.nac, sz)
    assert after <= before
    new_sz = sz[order]
    assert simulate(ops, build_schedule(ops, sizes=new_sz), new_sz).peak_bytes == after


@pytest.mark.parametrize('name', ['cnn', 'llama'])
def test_dynamic_batch_schedule_is_minimal_for_the_example_batch(name, tmp_path):
    """With a dynamic batch, compile() sizes values at the example's batch (symbolic dimensions at their hints): the
    saved schedule meets the lower bound at that batch and stays valid (and runs coupled) at another batch."""
    warnings.filterwarnings('ignore')
    x3 = example_inputs(name, 3)
    m = nac_compile(build_model(name), x3, dynamic_shapes=tuple({0: torch.export.Dim.AUTO} for _ in x3))
    back = read_checked(m.save(tmp_path / f'{name}.nac'))
    sz3 = sizes_from_run(m, *x3)
    assert list(m.value_sizes) == list(sz3)
    rep = simulate(back, sizes=sz3)
    assert rep.valid and rep.peak_bytes == rep.lower_bound
    x1 = example_inputs(name, 1, seed=4)
    rep1 = simulate(back, sizes=sizes_from_run(m, *x1))
    assert rep1.valid and rep1.peak_bytes >= rep1.lower_bound
    assert coupled_check(m, *x1, records=back.mmap).ok


def test_quantized_schedule_is_minimal_for_stored_sizes(tmp_path):
    """A quantized file's schedule is sized with parameters at their stored (int8) size, which is what a PRELOAD
    moves: it meets the lower bound for those sizes, and every non-parameter size is the run's. (The interpreter
    holds dequantized float32 weights, so bytes measured from a run are larger for parameters; the schedule stays
    valid under them.)"""
    warnings.filterwarnings('ignore')
    xs = example_inputs('llama')
    m = nac_compile(build_model('llama'), xs, quant='int8_channel')
    back = read_checked(m.save(tmp_path / 'q.nac'))
    run = sizes_from_run(m, *xs)
    params = [i for i, ins in enumerate(back.ops) if ins.A == 2 and ins.B == 1]
    for i in params:
        t = back.tensors[back.ops[i].C[1]]
        assert m.value_sizes[i] == t.data.size * t.data.itemsize
        if t.data.dtype.itemsize == 1 and t.data.ndim >= 1: assert m.value_sizes[i] * 4 == run[i]
    others = [i for i in range(len(back.ops)) if i not in set(params)]
    assert list(m.value_sizes[others]) == list(run[others])
    rep = simulate(back, sizes=m.value_sizes)
    assert rep.valid and rep.peak_bytes == rep.lower_bound
    assert simulate(back, sizes=run).valid and coupled_check(m, *xs, records=back.mmap).ok
