"""Every zoo model: the compiler's MMAP schedule is valid; the sized schedule meets the lower bound and survives the
interpreter-coupled run; the file round-trips with its schedule; `nac-lab schedule check` accepts it; reordering
never makes the bound worse."""
import json, warnings
import pytest

torch = pytest.importorskip('torch')
from nac_lab.nac.zoo import zoo_names, build_model, example_inputs
from nac_lab.nac.compile import compile as nac_compile
from nac_lab.nac.format import read_nac, write_nac, MmapAction as A
from nac_lab.nac.mmap import build_schedule, mmap_violations, commands_of, reorder, lower_bound, Command, to_records
from nac_lab.nac.mmap_sim import simulate, sizes_from_run, coupled_check, without_frees
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
