"""`nac_lab.check` on good files (zoo models, external weights, states) and on seeded defects, each found with its
place; `<OUTPUT B=2>` state write-back vs eager over several calls, pre-ruling `<OUTPUT B=1>` files still read the
same way, and `<OUTPUT B=1>` intermediate outputs compiled from module paths."""
import json
import pytest
import torch
import nac_lab
from nac_lab.cli import run_cli
from nac_lab.nac.format import read_nac, write_nac, state_writes, SysOp
from nac_lab.nac.compiler.zoo import build_model, example_inputs

class Acc(torch.nn.Module):
    "A running sum (a mutated buffer becomes a state) and a linear layer."
    def __init__(self):
        super().__init__(); torch.manual_seed(1)
        self.fc = torch.nn.Linear(3, 3); self.register_buffer('acc', torch.zeros(3))
    def forward(self, x):
        self.acc.add_(x.sum(0))
        return self.fc(x) + self.acc

def eager_calls(xs):
    m = Acc().eval(); out = []
    with torch.no_grad():
        for x in xs: out.append(m(x).clone())
    return out

XS = [torch.randn(2, 3, generator=torch.Generator().manual_seed(k)) for k in range(4)]

def test_state_write_back_is_output_b2():
    m = nac_lab.compile(Acc().eval(), (XS[0],))
    outs = [(i, ins.B) for i, ins in enumerate(m.nac.ops) if ins.A == SysOp.OUTPUT]
    assert [b for _, b in outs] == [2, 0] and state_writes(m.nac, outs[0][0]) == [m.nac.ops[outs[0][0]].C[1]]
    back = nac_lab.NacModel(read_nac(m.to_bytes()))
    for got, want in zip([back.run(x)[0] for x in XS], eager_calls(XS)): assert torch.allclose(got, want, atol=1e-6)
    assert nac_lab.check(m.to_bytes()).ok

def test_pre_ruling_b1_state_write_still_runs():
    m = nac_lab.compile(Acc().eval(), (XS[0],))
    old = read_nac(m.to_bytes())
    k = next(i for i, ins in enumerate(old.ops) if ins.A == SysOp.OUTPUT and ins.B == 2)
    old.ops[k].B = 1                                                   # how nac_lab wrote it before the ruling
    blob = write_nac(old)
    assert blob[3] == 2                                                # a B=1 state write is an extension too: marked
    back = nac_lab.NacModel(read_nac(blob))
    assert state_writes(back.nac, k) is not None
    for got, want in zip([back.run(x)[0] for x in XS], eager_calls(XS)): assert torch.allclose(got, want, atol=1e-6)
    assert back.interpreter.intermediate == []

def test_state_write_back_is_marked_with_version_2():
    "Issue 28 item 6: §7.2 has no state write; files with one carry version byte 2, which spec-only readers refuse (decision NAC 1)."
    blob = nac_lab.compile(Acc().eval(), (XS[0],)).to_bytes()
    assert blob[:4] == b'NAC\x02'
    plain = nac_lab.compile(torch.nn.Linear(3, 3).eval(), (XS[0],)).to_bytes()
    assert plain[:4] == b'NAC\x01'                                     # no state: the spec's version, unchanged
    def spec_reader_header(b):                                           # decision NAC 1: any byte but 1 is refused, naming it
        if b[3] != 1: raise ValueError(f'unsupported version {b[3]}')
    with pytest.raises(ValueError, match='unsupported version 2'): spec_reader_header(blob)
    spec_reader_header(plain)
    old = bytearray(blob); old[3] = 1                                    # written between ruling 13 and this decision
    back = nac_lab.NacModel(read_nac(bytes(old)))
    assert back.nac.version == 1 and nac_lab.check(bytes(old)).ok
    for got, want in zip([back.run(x)[0] for x in XS], eager_calls(XS)): assert torch.allclose(got, want, atol=1e-6)
    assert write_nac(back.nac)[:4] == b'NAC\x02'                       # marked when written again
    bad = bytearray(blob); bad[3] = 3
    with pytest.raises(Exception, match='unsupported version 3'): read_nac(bytes(bad))


def test_intermediate_outputs_compiled():
    torch.manual_seed(0)
    mlp = build_model('mlp').eval()
    x = example_inputs('mlp', 2, seed=1)
    paths = [n for n, mod in mlp.named_modules() if isinstance(mod, torch.nn.Linear)][:2]
    m = nac_lab.compile(mlp, x, intermediate=paths)
    out, inter = nac_lab.NacModel(read_nac(m.to_bytes())).run_with_intermediate(*x)
    with torch.no_grad():
        mods = dict(mlp.named_modules()); seen = {}
        hooks = [mods[p].register_forward_hook(lambda mod, a, r, p=p: seen.__setitem__(p, r)) for p in paths]
        ref = mlp(*x)
        for h in hooks: h.remove()
    assert torch.allclose(out[0], ref, atol=1e-5) and len(inter) == 1 and len(inter[0]) == len(paths)
    for v, p in zip(inter[0], paths): assert torch.allclose(v, seen[p], atol=1e-5)

@pytest.mark.parametrize('name', ['mlp', 'cnn', 'vit_tiny'])
def test_zoo_files_check_clean(name, tmp_path):
    m = nac_lab.compile(build_model(name), example_inputs(name, 1), weights='external')
    p = m.save(tmp_path / f'{name}.nac')
    rep = nac_lab.check(p)
    assert rep.ok, str(rep)
    assert {'container', 'references', 'weights', 'runtime', 'MMAP', 'signature', 'MMAP run'} <= set(rep.checks)

def test_external_weights_defects(tmp_path):
    m = nac_lab.compile(Acc().eval(), (XS[0],), weights='external')
    p = m.save(tmp_path / 'acc.nac'); st = p.with_suffix('.safetensors')
    nac = read_nac(p)
    names = dict(nac.param_names)
    from safetensors.numpy import load_file, save_file
    ts = load_file(str(st)); dropped = sorted(ts)[0]; del ts[dropped]
    save_file(ts, str(st))
    rep = nac_lab.check(p)
    assert not rep.ok and any(dropped in str(q) for q in rep.problems), str(rep)
    st.unlink()
    rep = nac_lab.check(p)
    assert [str(q) for q in rep.problems] == ['external weights acc.safetensors: file not found beside the .nac']
    rc, out, err = run_cli('check', p)
    assert rc == 1 and 'file not found beside the .nac' in out

def test_several_defects_each_with_place(tmp_path):
    "Five independent defects in one file: the report names every one with its place, in file order of the layers."
    m = nac_lab.compile(Acc().eval(), (XS[0],))
    nac = read_nac(m.to_bytes())
    ops = nac.ops
    w = next(i for i, ins in enumerate(ops) if ins.A == SysOp.OUTPUT and ins.B == 2)
    op = next(i for i, ins in enumerate(ops) if ins.A >= 10)
    ops[op].D = [d if d == 0 else -(op + 5) for d in ops[op].D]          # 1: a reference before instruction 0
    nac.n_inputs = 4                                                    # 2: header count wrong
    st = next(i for i, ins in enumerate(ops) if not (ins.A == SysOp.INPUT and ins.B == 0))
    nac.rsrc['signature.json'] = json.dumps({'format': 'nac_lab.signature', 'version': 1, 'dims': {},
                                             'inputs': [{'name': 'x', 'at': st, 'dtype': 'float32', 'shape': [2, 3]}]}).encode()   # 3
    nac.proc = b'TISA\x01\x99\x00\x00\x00\x00'                           # 4: unknown TISA opcode
    nac.orch.bytecode, nac.orch.n_consts, nac.orch.pool = b'\xa1\x00\x00', 0, b''   # 5: a loop end without a start
    rep = nac_lab.check(write_nac(nac, check=False))
    text = str(rep)
    assert f'OPS instruction {op}: D offset' in text, text
    assert 'header at offset 0x5: n_inputs = 4' in text
    assert f'RSRC signature.json $.inputs[0].at: instruction {st} is not an <INPUT B=0>' in text
    assert any(q.place == 'PROC' for q in rep.problems) and any(q.place.startswith('ORCH') for q in rep.problems)
    assert len(rep.problems) >= 5

class Gate(torch.nn.Module):
    "A data-dependent `torch.cond` with weights in both branches (compiled to <CONTROL_FLOW> blocks)."
    def __init__(self):
        super().__init__(); self.a, self.b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3)
    def forward(self, x): return torch.cond(x.sum() > 0, lambda t: self.a(t).relu(), lambda t: self.b(t) * 2, (x,))

def test_control_flow_file_checks_clean_and_a_broken_block_is_named():
    torch.manual_seed(0)
    m = nac_lab.compile(Gate().eval(), (torch.randn(2, 3),))
    rep = nac_lab.check(m.to_bytes())
    assert rep.ok, rep
    bad = read_nac(m.to_bytes())
    cf = next(i for i, ins in enumerate(bad.ops) if ins.A == SysOp.CONTROL_FLOW)
    bad.ops[cf].C[1] += 1                                   # the true block now swallows the false block's first instruction
    rep = nac_lab.check(write_nac(bad))
    assert not rep.ok and any('CONTROL_FLOW' in str(p) for p in rep.problems), rep
