"""MEP: byte round trips of random plans, fuzzed bytecode and pools (typed errors only, bounded runs), every opcode
executed with independently computed expectations, the reference's mlp_mep plan through the CLI."""
import io, json, random
import numpy as np
import pytest
from nac_lab.binio import NacLabError
from nac_lab.cli import run_cli
from nac_lab.nac.format import NacFile, Orch, read_nac
from nac_lab.nac.orch.mep import (MEP_OPCODES, MEP_NAMES, MepIns, MepProgram, MepFormatError, Plan, decode_bytecode, decode_pool,
                                  encode_pool, listing, REF_CODE, REF_POOL)
from nac_lab.guard import MAX_BYTES_ENV, MemoryLimitError
from nac_lab.nac.orch.mep_vm import MepVM, MepLimitError, MepRunError, MepBudgetError, PLAN_MAX_BYTES

def random_ins(rng, op):
    args = {}
    for n, k in [tuple(f.split(':')) for f in MEP_OPCODES[op][1].split()]:
        if k.endswith('?') and args.get('op') != 1: continue
        k = k.rstrip('?')
        if k == 'K': args[n] = [rng.randrange(256) for _ in range(rng.randrange(5))]
        elif k in 'kb': args[n] = rng.randrange(256)
        elif k == 'c': args[n] = rng.randrange(4)
        else: args[n] = 0
    return MepIns(op, args)

def random_program(rng):
    "A random, well-formed program: random instructions, jumps only to instruction starts, balanced loops."
    ops = [o for o in MEP_OPCODES if MEP_OPCODES[o][0] not in ('FLOW_LOOP_START', 'FLOW_LOOP_END', 'FLOW_BRANCH_IF', 'FLOW_BREAK_LOOP_IF')]
    p = Plan()
    for name in ('a', 'b', 'c', 'd'): p.const(name)
    depth = 0
    for _ in range(rng.randrange(1, 30)):
        r = rng.random()
        if r < 0.1: p.loop(rng.randrange(256)); depth += 1
        elif r < 0.2 and depth: p.end_loop(); depth -= 1
        elif r < 0.25 and depth: p.break_if(rng.randrange(256))
        else: p.instrs.append(random_ins(rng, rng.choice(ops)))
    for _ in range(depth): p.end_loop()
    return p.program()

@pytest.mark.parametrize('seed', range(200))
def test_random_program_round_trip(seed):
    rng = random.Random(seed)
    prog = random_program(rng)
    o = prog.to_orch()
    back = MepProgram.from_orch(o)
    assert back.to_orch().bytecode == o.bytecode and back.to_orch().pool == o.pool
    assert [(i.opcode, i.args) for i in back.instrs] == [(i.opcode, i.args) for i in prog.instrs]
    assert len(listing(back, o.bytecode).splitlines()) == len(back.instrs) + 1 + len(back.consts)

def test_fuzz_bytes_decode_typed_errors_only():
    rng = random.Random(1)
    for k in range(3000):
        code = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        try: decode_bytecode(code)
        except MepFormatError as ex: assert ex.offset is not None and 0 <= ex.offset <= len(code), ex
        pool = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        try: decode_pool(pool, rng.randrange(4))
        except MepFormatError as ex: assert ex.offset is not None

def _vm_for(code, pool_consts, tmp):
    nac = NacFile(); nac.orch = Orch(code, len(pool_consts), encode_pool(pool_consts))
    return MepVM(nac, base_dir=tmp, out=io.StringIO(), max_steps=2000, max_elements=1 << 16)

def test_fuzz_mutated_plans_run_bounded(tmp_path):
    "Mutations of a real plan either fail to decode (typed, with offset) or run to a typed end within the step limit."
    base = (Plan().set(5, 'n').set(0, 'i').set(1, 'one').set([2, 3], 'shape').set('x={} y={}', 'f')
            .tensor('shape', 't', dtype=0, mode=2).loop('n').add('i', 'one', 'i').gt('i', 'one', 'c').break_if('c').end_loop()
            .format('{} {}', ['i', 't'], 's').write('s').softmax('t', 'p').argmax('p', 'a').ret('i', 'a'))
    prog = base.program(); o = prog.to_orch()
    assert _vm_for(o.bytecode, prog.consts, tmp_path).run()[0] == 2
    rng = random.Random(2)
    outcomes = {}
    for k in range(1500):
        b = bytearray(o.bytecode)
        for _ in range(rng.randrange(1, 4)): b[rng.randrange(len(b))] = rng.randrange(256)
        try: vm = _vm_for(bytes(b), prog.consts, tmp_path)
        except MepFormatError as ex:
            assert ex.offset is not None; outcomes['format'] = outcomes.get('format', 0) + 1; continue
        try: vm.run(); outcomes['ok'] = outcomes.get('ok', 0) + 1
        except NacLabError as ex:
            assert str(ex).startswith('MEP 0x'), ex                       # names the instruction
            outcomes[type(ex).__name__] = outcomes.get(type(ex).__name__, 0) + 1
    assert outcomes.get('format') and outcomes.get('ok') and outcomes.get('MepRunError'), outcomes

def test_step_limit_nested_loops(tmp_path):
    p = Plan().set(255, 'n').loop('n').loop('n').loop('n').end_loop().end_loop().end_loop().ret('n')
    prog = p.program()
    with pytest.raises(MepLimitError, match='step limit 2000'): _vm_for(prog.to_orch().bytecode, prog.consts, tmp_path).run()

def test_every_opcode(tmp_path):
    "One plan per group of opcodes; expectations computed with numpy/json directly; every opcode runs at least once."
    from PIL import Image
    seen = set()
    class Rec(MepVM):
        def __getattribute__(self, n):
            if n.startswith('_') and n[1:] in MEP_NAMES: seen.add(n[1:])
            return object.__getattribute__(self, n)
    rgb = np.random.default_rng(0).integers(0, 256, (300, 400, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / 'img.png')
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / 'x.npy', x)
    nac = NacFile(); nac.rsrc = {'r.npy': (tmp_path / 'x.npy').read_bytes(), 'blob': b'\x01\x02'}
    p = (Plan().prompt('n? ', 'pn', dtype=5).prompt('name? ', 'pt').set('x.npy', 'xp').set('img.png', 'ip').set(4, 'four').set(2, 'two')
         .set([1, 2], 'pad2').set(-1.0, 'fill').set([4, 3], 'shp').set(0, 'zero').set(1, 'one').set([1, 2], 'ix')
         .load_npy('x', 'x.npy').load_extern('r.npy', 'r').load_extern('blob', 'blob').load_extern('x.npy', 'fx', res_type=1)
         .load_dynamic('xp', 'dx').load_dynamic('ip', 'img', file_type=3)
         .tensor('four', 'ar', dtype=5, mode=1).tensor('shp', 'ones', dtype=0, mode=2).tensor('pn', 'pv', dtype=0)
         .pad('x', 'pad2', 'fill', 'xpad').reshape('x', 'shp', 'xr').concat(['x', 'x'], 'zero', 'cat')
         .shape('x', 'sh').dim('x', 'one', 'd1').to_py('ar', 'py').extract('x', 'ix', 'e12')
         .sub('four', 'two', 'df').mul('four', 'two', 'pr').ne('four', 'two', 'ne').lt('four', 'two', 'lt')
         .serialize('x', 'js').serialize('py', 'st', format=1).debug('x', 'the x').copy('x', 'xc').halt())
    nac_out = io.StringIO()
    p.attach(nac)
    vm = Rec(nac, base_dir=tmp_path, out=nac_out)
    assert vm.run(prompts=['3 5', 'Ada']) == []
    c = {n: vm.ctx[vm_slot] for n, vm_slot in p.slots.items() if vm_slot in vm.ctx}
    assert np.array_equal(c['x'], x) and np.array_equal(c['r'], x) and np.array_equal(c['fx'], x) and np.array_equal(c['dx'], x)
    assert c['blob'] == b'\x01\x02' and c['pt'] == 'Ada' and c['pv'].tolist() == [3.0, 5.0] and c['pn'].dtype == np.int64
    assert c['img'].shape == (1, 3, 224, 224) and c['img'].dtype == np.float32
    # independent ImageNet preprocessing of the centre pixel: resize 300x400 -> 256x341 bilinear (PIL), crop centre 224
    ref = np.asarray(Image.fromarray(rgb).resize((341, 256), Image.BILINEAR), np.float32)[16:240, 58:282] / 255.0
    ref = (ref - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    assert np.allclose(c['img'][0].transpose(1, 2, 0), ref, atol=1e-5)
    assert c['ar'].tolist() == [0, 1, 2, 3] and c['ones'].shape == (4, 3)
    assert np.array_equal(c['xpad'], np.pad(x, [(0, 0), (1, 2)], constant_values=-1.0))
    assert np.array_equal(c['xr'], x.reshape(4, 3)) and c['cat'].shape == (6, 4)
    assert c['sh'] == [3, 4] and c['d1'] == 4 and c['py'] == [0, 1, 2, 3] and c['e12'] == 6.0
    assert (c['df'], c['pr'], c['ne'], c['lt']) == (2, 8, True, False)
    assert json.loads(c['js']) == x.tolist() and c['st'] == '[0, 1, 2, 3]'
    assert nac_out.getvalue() == '[debug] the x: array float32[3, 4]\n'
    # analysis and control flow
    q = (Plan().set(3, 'k').set(1.0, 't').set(0, 'all').set(2, 'n').set(0, 'i').set(1, 'one').set(True, 'T')
         .topk('x', 'k', 'ti', 'tv').sample('x', 't', 'k', 's').softmax('x', 'sm').argmax('x', 'am')
         .loop('n').add('i', 'one', 'i').eq('i', 'n', 'done').break_if('done').end_loop().format('<{}>', ['i'], 'msg')
         .branch_if('T', 'end').write('msg').label('end').write('msg', mode=1).ret('i', 'ti', 'tv', 's', 'sm', 'am'))
    nac2 = NacFile(); q.attach(nac2)
    out2 = io.StringIO()
    i, ti, tv, smp, sm, am = Rec(nac2, base_dir=tmp_path, out=out2).run({q.slot('x'): x}, seed=4)
    assert i == 2 and out2.getvalue() == '<2>'
    assert ti.tolist() == [[3, 2, 1]] * 3 and np.array_equal(tv, x[:, ::-1][:, :3]) and am.tolist() == [3, 3, 3]
    assert np.allclose(sm, np.exp(x - x.max(1, keepdims=True)) / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True))
    # ANALYSIS_SAMPLE on the last row, top-3 (ids 3, 2, 1), temperature 1, one PCG64(4) draw through the inverse CDF
    row = x[-1, [3, 2, 1]].astype(np.float64); pr = np.exp(row - row.max()); pr /= pr.sum()
    u = np.random.Generator(np.random.PCG64(4)).random()
    assert smp == [3, 2, 1][int(np.searchsorted(np.cumsum(pr), u, side='right'))]
    missing = {n for n, _ in MEP_OPCODES.values()} - seen - {'RES_LOAD_MODEL', 'MODEL_RUN_STATIC', 'PREPROC_ENCODE', 'PREPROC_DECODE',
                                                             'PREPROC_GET_ID'}
    assert not missing, missing          # the excluded ones run in test_reference_plan_cli and test_tokenizer_opcodes

def _mlp_file(tmp_path):
    import torch
    from nac_lab.nac.compiler.zoo import build_model, example_inputs
    from nac_lab.nac.compiler.compile import compile as nac_compile
    m = build_model('mlp'); x = example_inputs('mlp', 2, seed=9)[0]
    nm = nac_compile(m, (x,), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    nm.nac.orch = Orch(REF_CODE, 2, REF_POOL)
    nm.save(tmp_path / 'mlp_mep.nac'); np.save(tmp_path / 'mlp_x.npy', x.numpy())
    with torch.no_grad(): return m(x).numpy()

def test_reference_plan_cli(tmp_path):
    ref = _mlp_file(tmp_path)
    rc, out, err = run_cli('run', tmp_path / 'mlp_mep.nac', '--orchestrated', '-o', tmp_path / 'y.npz')
    assert (rc, err) == (0, ''), err
    assert np.allclose(np.load(tmp_path / 'y.npz')['output0'], ref, atol=1e-5)
    rc, out, err = run_cli('inspect', tmp_path / 'mlp_mep.nac', '--orch', '--json')
    assert rc == 0 and json.loads(out)['orch'][2].startswith('0004  11 00 02 01 00')
    # an output name without .npz gets it appended (as np.savez does), so the plan's own .nac is never replaced
    before = (tmp_path / 'mlp_mep.nac').read_bytes()
    rc, out, err = run_cli('run', tmp_path / 'mlp_mep.nac', '--orchestrated', '-o', tmp_path / 'mlp_mep.nac')
    assert rc == 0 and (tmp_path / 'mlp_mep.nac.npz').is_file() and (tmp_path / 'mlp_mep.nac').read_bytes() == before

def test_plan_paths_confined(tmp_path):
    _mlp_file(tmp_path)
    nac = read_nac(tmp_path / 'mlp_mep.nac')
    for bad, msg in [('../mlp_x.npy', 'leaves the folder'), ('/tmp/x.npy', 'is absolute')]:
        Plan().load_model(0, 'mlp_mep.nac').load_npy('x', bad).ret('x').attach(nac)
        nac.save(tmp_path / 'bad.nac')
        rc, out, err = run_cli('run', tmp_path / 'bad.nac', '--orchestrated')
        assert rc == 1 and msg in err and 'RES_LOAD_DATAFILE' in err, err

def test_malformed_orch_in_file(tmp_path):
    nac = NacFile(); nac.orch = Orch(bytes.fromhex('10000000fe02'), 1, encode_pool(['m.nac']))
    nac.save(tmp_path / 'm.nac')
    rc, out, err = run_cli('run', tmp_path / 'm.nac', '--orchestrated')
    assert rc == 1 and 'offset 0x6' in err and 'EXEC_RETURN' in err, err

def test_tokenizer_opcodes(tmp_path):
    from nac_lab.nac.tokenizer.tisa import attach_tokenizer
    vocab = {'[UNK]': 0, 'hello': 1, 'world': 2, '!': 3, '[EOS]': 4}
    j = {'added_tokens': [{'id': 4, 'content': '[EOS]', 'special': True, 'normalized': False}],
         'normalizer': {'type': 'Lowercase'}, 'pre_tokenizer': {'type': 'BertPreTokenizer'},
         'model': {'type': 'WordPiece', 'unk_token': '[UNK]', 'continuing_subword_prefix': '##', 'vocab': vocab},
         'decoder': {'type': 'WordPiece', 'prefix': '##', 'cleanup': True}}
    nac = NacFile(); attach_tokenizer(nac, json.dumps(j))
    p = (Plan().load_model(0, 't.nac').set('Hello World!', 's').encode(0, 's', 'ids').token_id(0, '[EOS]', 'eos')
         .decode(0, 'ids', 'back').ret('ids', 'eos', 'back'))
    p.attach(nac); nac.save(tmp_path / 't.nac')
    ids, eos, back = MepVM(tmp_path / 't.nac').run()
    assert ids.tolist() == [[1, 2, 3]] and eos == 4 and back == 'hello world!'

def test_size_limits_before_allocation(tmp_path):
    "Broadcasts, concatenations and text conversions that would blow up are refused before numpy allocates."
    col, long = np.zeros((1 << 16, 1), np.float32), np.zeros(1 << 21, np.float32)
    cases = [(Plan().add('x', 'xt', 'y'), col, 'exceeds the limit'),
             (Plan().eq('x', 'xt', 'y'), col, 'exceeds the limit'),
             (Plan().set(0, 'z').concat(['x'] * 200, 'z', 'y'), col, 'exceeds the limit'),
             (Plan().write('x'), long, 'too large to turn into text'),
             (Plan().serialize('x', 'j'), long, 'too large to turn into text')]
    for p, x, msg in cases:
        sx, st = p.slot('x'), p.slot('xt')
        nac = NacFile(); nac.orch = p.program().to_orch()
        vm = MepVM(nac, base_dir=tmp_path, out=io.StringIO(), max_elements=1 << 22)
        with pytest.raises(MepLimitError, match=msg): vm.run({sx: x, st: x.T})

# --- budgets (#28 item 8) ---------------------------------------------------------------------------------------------------
def test_budget_defaults(tmp_path, monkeypatch):
    nac = NacFile(); Plan().set(1, 'a').attach(nac)
    monkeypatch.delenv(MAX_BYTES_ENV, raising=False)
    vm = MepVM(nac, base_dir=tmp_path)
    assert (vm.max_bytes, vm.max_work, vm.max_output, vm.max_steps) == (1 << 30, 1 << 34, 1 << 24, 1_000_000)
    monkeypatch.setenv(MAX_BYTES_ENV, '5000')
    assert MepVM(nac, base_dir=tmp_path).max_bytes == 5000 and MepVM(nac, base_dir=tmp_path, max_bytes=7).max_bytes == 7
    assert PLAN_MAX_BYTES == 1 << 30

def _plan_file(tmp_path, plan, name='p.nac'):
    nac = NacFile(); plan.attach(nac); nac.save(tmp_path / name)
    return tmp_path / name

def test_budgets_through_the_cli(tmp_path):
    "The issue's reproducers end with a one-line typed error (exit 1) naming the instruction, at budgets set on the command line."
    doubling = _plan_file(tmp_path, Plan().set('x' * 60000, 's').set(40, 'n').loop('n').add('s', 's', 's').end_loop().ret('s'), 'd.nac')
    rc, out, err = run_cli('run', doubling, '--orchestrated', '--max-bytes', str(1 << 22))
    assert rc == 1 and 'MATH_BINARY' in err and 'over the budget of 4194304 (max_bytes' in err and 'Traceback' not in err, err
    twelve = Plan().set([1 << 16], 'shape')
    for k in range(12): twelve.tensor('shape', f't{k}', dtype=0, mode=2)
    rc, out, err = run_cli('run', _plan_file(tmp_path, twelve, 't.nac'), '--orchestrated', '--max-bytes', str(1 << 20))
    assert rc == 1 and 'TENSOR_CREATE: a 262144-byte tensor would bring live memory' in err, err
    loop = Plan().set([1 << 16], 'shape').set(10**6, 'n').loop('n').tensor('shape', 't', dtype=0, mode=2).end_loop()
    rc, out, err = run_cli('run', _plan_file(tmp_path, loop, 'l.nac'), '--orchestrated', '--max-work', str(1 << 24))
    assert rc == 1 and 'max_work' in err, err
    talk = Plan().set('\x1b]0;pwned\x07\x1b[2J', 's').set(1000, 'n').loop('n').write('s').end_loop()
    rc, out, err = run_cli('run', _plan_file(tmp_path, talk, 'w.nac'), '--orchestrated', '--max-output', '1000')
    assert rc == 1 and 'output budget of 1000' in err, err
    assert '\x1b' not in out and '\x07' not in out and out.startswith('\\x1b]0;pwned\\x07\\x1b[2J\n'), out[:80]

def test_npy_header_larger_than_file(tmp_path):
    h = b"{'descr': '<f4', 'fortran_order': False, 'shape': (68719476736,), }"
    (tmp_path / 'huge.npy').write_bytes(b'\x93NUMPY\x01\x00' + (118).to_bytes(2, 'little') + h.ljust(117) + b'\n')
    nac = NacFile(); Plan().load_npy('x', 'huge.npy').ret('x').attach(nac)
    with pytest.raises(MepRunError,
                       match=r'RES_LOAD_DATAFILE: huge.npy is not a readable .npy array \(.*needs 274877906944 data bytes, the '
                             r'file has 0\)'):
        MepVM(nac, base_dir=tmp_path).run()

# structure-aware plan fuzzing: random plans of real opcodes wired through a few slots, with hostile constants
HOSTILE = [0, 1, -1, 3, 2**31, 2**40, 10**9, -2**63, 0.5, float('nan'), float('inf'), '', 'x' * 5000, '\x1b[2J\u202e', '{}{}{0}',
           '{:>999}', [1 << 12, 1 << 12], [1 << 30], [-1, 4], [0], [3, 4], [], 'a\x00b', True, 2, 5, 'abc', [512, 512], [1024, 1024],
           [1 << 20], 60]
SLOTS = 'abcdef'

def random_plan(rng):
    "A plan of 1-25 real instructions whose operands are drawn from six slots, each first set to a hostile constant."
    p = Plan()
    for s in SLOTS: p.set(rng.choice(HOSTILE), s)
    S = lambda: rng.choice(SLOTS)
    steps = [lambda: p.tensor(S(), S(), dtype=rng.choice([0, 1, 4, 5, 8, 9, 3, 77]), mode=rng.randrange(4)),
             lambda: p.pad(S(), S(), S(), S()), lambda: p.reshape(S(), S(), S()), lambda: p.concat([S(), S()], S(), S()),
             lambda: p.shape(S(), S()), lambda: p.dim(S(), S(), S()), lambda: p.to_py(S(), S()), lambda: p.extract(S(), S(), S()),
             lambda: p.copy(S(), S()), lambda: p.debug(S(), rng.choice(['m', '\x1b[31m'])), lambda: p.softmax(S(), S()),
             lambda: p.add(S(), S(), S()), lambda: p.mul(S(), S(), S()), lambda: p.sub(S(), S(), S()), lambda: p.argmax(S(), S()),
             lambda: p.gt(S(), S(), S()), lambda: p.eq(S(), S(), S()), lambda: p.topk(S(), S(), S(), S()),
             lambda: p.sample(S(), S(), S(), S()), lambda: p.serialize(S(), S(), format=rng.randrange(3)),
             lambda: p.write(S(), mode=rng.randrange(2)), lambda: p.format(rng.choice(HOSTILE[12:16]), [S(), S()], S()),
             lambda: p.load_npy(S(), rng.choice(['ok.npy', 'huge.npy', '../x.npy', 'missing.npy']))]
    depth = 0
    for _ in range(rng.randrange(1, 26)):
        if rng.random() < 0.3: p.tensor(S(), S(), dtype=0, mode=2)          # often a tensor from a shape: sizes reach the budgets
        r = rng.random()
        if r < 0.12: p.loop(S()); depth += 1
        elif r < 0.2 and depth: p.end_loop(); depth -= 1
        elif r < 0.25 and depth: p.break_if(S())
        else: rng.choice(steps)()
    for _ in range(depth): p.end_loop()
    return p.ret(S(), S())

def test_fuzz_structured_plans_stay_in_budget(tmp_path, fuzz_cases):
    "Random real plans reach the VM and end returning or with a typed error naming the instruction, inside every budget."
    np.save(tmp_path / 'ok.npy', np.arange(6, dtype=np.float32).reshape(2, 3))
    h = b"{'descr': '<f4', 'fortran_order': False, 'shape': (68719476736,), }"
    (tmp_path / 'huge.npy').write_bytes(b'\x93NUMPY\x01\x00' + (118).to_bytes(2, 'little') + h.ljust(117) + b'\n')
    rng, outcomes, ran, deep = random.Random(28), {}, 0, 0
    budgets = dict(max_steps=3000, max_elements=1 << 20, max_bytes=1 << 22, max_work=1 << 25, max_output=1 << 12)
    for k in fuzz_cases(range(600), 'MEP plans'):
        nac = NacFile(); random_plan(rng).attach(nac)
        out = io.StringIO()
        vm = MepVM(nac, base_dir=tmp_path, out=out, **budgets)
        try: vm.run(seed=k); kind = 'ok'
        except NacLabError as ex:
            assert str(ex).startswith('MEP 0x'), ex
            kind = type(ex).__name__
        outcomes[kind] = outcomes.get(kind, 0) + 1
        ran += vm.steps > 6; deep += vm.steps > 8              # past the six constants: the plan reached the opcodes under test
        assert vm.live() <= budgets['max_bytes'] and vm.work <= budgets['max_work'] and vm.written <= budgets['max_output']
        assert len(out.getvalue()) == vm.written and not any(c in out.getvalue() for c in '\x00\x07\x1b\u202e')
    assert ran == 600 and deep >= 80, (ran, deep)              # every plan reached an opcode; 106 of them ran three or more
    assert outcomes.get('MepBudgetError', 0) >= 10, outcomes
    assert {'ok', 'MepRunError', 'MepBudgetError', 'MepLimitError', 'MepPathError'} <= set(outcomes), outcomes
    assert issubclass(MepBudgetError, MemoryLimitError)

def test_image_sized_before_decoding(tmp_path):
    "A PNG is sized from its header: a 3000x3000 image (36 MB as RGBA bytes) is refused under a 16 MiB budget before it is decoded."
    from PIL import Image
    Image.new('RGB', (3000, 3000)).save(tmp_path / 'big.png')
    nac = NacFile(); Plan().set('big.png', 'p').load_dynamic('p', 'img', file_type=3).ret('img').attach(nac)
    with pytest.raises(MepBudgetError, match=r'RES_LOAD_DYNAMIC: a 36000000-byte decoded image big.png of 3000x3000 pixels'):
        MepVM(nac, base_dir=tmp_path, max_bytes=16 << 20).run()
    assert MepVM(nac, base_dir=tmp_path).run()[0].shape == (1, 3, 224, 224)
