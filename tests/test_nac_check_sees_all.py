"""`nac-lab check` finds what its sibling commands find (issue 28 items 2 and 12): the MMAP replay of `schedule check`
runs with or without a signature, a program that fails on inputs made from its own signature is a problem, and so
is an allocation the memory budget refuses (2 GiB unless NAC_LAB_MAX_BYTES says otherwise). Every file is made by
hand here; expected counts and places are worked out from the instruction streams, not taken from the checker."""
import json
import pytest

from nac_lab.cli import run_cli
from nac_lab.nac.format.check import check
from nac_lab.nac.format import NacFile, Instruction, MmapAction, write_nac, DataTensor, DType
from nac_lab.nac.schedule.mmap import commands_of, to_records, Command
from nac_lab.nac.schedule.mmap_sim import demo_nac
from nac_lab.nac.format.input_signature import Signature, InputSpec, attach_signature


def _reference_style_frees():
    """The demo stream (10 instructions) with every FREE one tick early: the reference compiler frees a value on the
    tick of its last read (decision NAC 10). Static rules hold (each FREE names an earlier instruction); the replay does not.
    FREEs of the demo: 1 at 3, 3 at 5, 6 at 8, 0 at 9; last readers: 1 -> 2, 3 -> 4, 6 -> 7, 0 -> 8."""
    nac, _ = demo_nac()
    cmds = [Command(c.tick - 1, c.action, c.target) if c.action == MmapAction.FREE else c for c in commands_of(nac.mmap)]
    nac.mmap = to_records(cmds)
    return nac


def test_reference_style_schedule_without_signature_is_a_problem(tmp_path):
    nac = _reference_style_frees()
    assert not (nac.rsrc or {}).get('signature.json')
    f = tmp_path / 'ref.nac'; f.write_bytes(write_nac(nac, check=False))
    rep = check(f)
    got = [(p.place, p.message) for p in rep.problems]
    assert got == [(f'MMAP tick {t}', f'FREE -> {v}: freed during its last read by instruction {t}: FREE belongs on tick {t + 1} '
                    f'(decision NAC 10)') for t, v in ((2, 1), (4, 3), (7, 6), (8, 0))], got
    rc, out, err = run_cli('check', str(f))
    assert rc == 1 and '4 problems' in out, (rc, out, err)
    rc2, out2, _ = run_cli('schedule', 'check', str(f), '--json')
    assert rc2 == 1
    sched = {(v['tick'], v['command'], v['target']) for v in json.loads(out2)['violations']}
    assert sched == {(2, 'FREE', 1), (4, 'FREE', 3), (7, 'FREE', 6), (8, 'FREE', 0)}      # the same four, from the sibling


def test_the_good_demo_schedule_stays_ok(tmp_path):
    nac, _ = demo_nac()
    rep = check(write_nac(nac))
    assert rep.ok and 'MMAP' in rep.checks, str(rep)
    assert any('no signature.json' in n for n in rep.notes)                    # nothing to run it on: a note, not a problem


def _linear(sig_shape, w_shape, *, mmap=False):
    "x (signature shape `sig_shape`) @ w.T with a stored weight of `w_shape`: fails at run time when the inner sizes differ."
    import numpy as np
    nac = NacFile(n_inputs=1, n_outputs=1)
    nac.ops = [Instruction.user_input(), Instruction.param(0)]
    nac.input_names = {0: 'x'}; nac.param_names = {0: 'w'}
    nac.tensors = {0: DataTensor(0, DType.F32, np.ones(w_shape, np.float32))}
    nac.cmap[201] = 'aten.linear.default'; nac.add_op(201, 'TT', [('ref', 0), ('ref', 1)])
    nac.ops.append(Instruction.output([-1]))
    attach_signature(nac, Signature([InputSpec('x', 0, 'float32', list(sig_shape))], {}))
    if mmap:
        from nac_lab.nac.schedule.mmap import build_schedule
        nac.mmap = build_schedule(nac)
    return nac


@pytest.mark.parametrize('mmap', [False, True], ids=['plain', 'mmap'])
def test_program_failing_on_its_signature_inputs_is_a_problem(tmp_path, mmap):
    good = check(write_nac(_linear([2, 3], [4, 3], mmap=mmap)))
    assert good.ok and ('MMAP run' if mmap else 'run') in good.checks, str(good)
    f = tmp_path / 'bad.nac'; f.write_bytes(write_nac(_linear([2, 5], [4, 3], mmap=mmap)))   # K = 5 against a weight of K = 3
    rep = check(f)
    assert len(rep.problems) == 1, str(rep)
    p = rep.problems[0]
    assert p.place == ('MMAP run' if mmap else 'run') and p.message.startswith('the program fails on inputs made from its signature'), p
    rc, out, _ = run_cli('check', str(f))
    assert rc == 1 and '1 problem' in out


def _repeat(sig_shape, reps):
    "A tiny file: x.repeat(*reps), x float32 of signature shape `sig_shape`."
    nac = NacFile(n_inputs=1, n_outputs=1)
    nac.ops = [Instruction.user_input()]; nac.input_names = {0: 'x'}
    nac.cmap[201] = 'aten.repeat.default'; nac.add_op(201, 'Ti', [('ref', 0), ('const', list(reps))])
    nac.ops.append(Instruction.output([-1]))
    attach_signature(nac, Signature([InputSpec('x', 0, 'float32', list(sig_shape))], {}))
    return nac


def test_tiny_file_asking_for_3_gb_is_a_problem_under_the_default_budget(tmp_path, monkeypatch):
    monkeypatch.delenv('NAC_LAB_MAX_BYTES', raising=False)
    f = tmp_path / 'r.nac'; f.write_bytes(write_nac(_repeat([4, 4], [10000, 5000])))
    assert f.stat().st_size < 400
    rep = check(f)                         # (4*10000) x (4*5000) float32 = 3,200,000,000 bytes > 2 GiB = 2,147,483,648
    assert [p.place for p in rep.problems] == ['run'], str(rep)
    assert 'allocation refused' in rep.problems[0].message
    assert 'the result would take 3200000000 bytes, above the limit of 2147483648 bytes' in rep.problems[0].message
    rc, out, _ = run_cli('check', str(f))
    assert rc == 1 and 'NAC_LAB_MAX_BYTES' in out
    from nac_lab.nac.schedule.mmap import build_schedule
    sched = _repeat([4, 4], [10000, 5000]); sched.mmap = build_schedule(sched)      # with a schedule: refused before the coupled run
    rep = check(write_nac(sched))
    assert [p.place for p in rep.problems] == ['MMAP run'] and '3200000000 bytes' in rep.problems[0].message, str(rep)
    monkeypatch.setenv('NAC_LAB_MAX_BYTES', str(64 * 40000))     # the budget is the variable's: 4000 x 40 float32 = 640,000 bytes
    assert check(write_nac(_repeat([4, 4], [1000, 10]))).ok


def test_signature_input_over_the_budget_is_refused_before_it_is_made(monkeypatch):
    monkeypatch.setenv('NAC_LAB_MAX_BYTES', str(1 << 20))
    rep = check(write_nac(_repeat([512, 513], [1, 1])))       # 512*513*4 = 1,050,624 bytes > 1 MiB = 1,048,576
    assert [p.place for p in rep.problems] == ['run'], str(rep)
    msg = rep.problems[0].message
    assert "signature input 'x' [512, 513]: the result would take 1050624 bytes, above the limit of 1048576 bytes" in msg
    assert check(write_nac(_repeat([512, 512], [1, 1]))).ok                 # exactly 1 MiB: allowed
