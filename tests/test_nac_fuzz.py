"""Mutation fuzzer for the .nac reader (issue 3, item 7).

Seeded random mutations -- byte and bit flips, interesting values written over 16/32/64-bit fields,
truncations, insertions, deletions and duplicated chunks -- of several valid files (every quantization
method, internal and external weights, all system ops, PROC/RSRC/ORCH present and absent, a reversed
section order). For every mutant the test asserts that

* `read_nac` either succeeds or raises an error of nac_lab's `FormatError` family, nothing else;
* a file it accepts can be listed, summarised, dequantized and written back, and the rewrite reads back
  to the same instructions (so acceptance is never a silent half-parse);
* no case hangs (a SIGALRM guard per case);
* memory stays proportional to the file: the tracemalloc peak of a case stays under
  1 MiB + 200 x the file size, so no count or length taken from the file is trusted for an allocation
  (a header that claims a million records would need tens of megabytes).

6,400 cases run in well under a minute on a laptop core.
"""
import json, random, signal, tracemalloc
import numpy as np
import pytest

from nac_lab.binio import FormatError
from nac_lab.nac.format import (NacFile, Instruction, MmapRecord, MmapCommand, MmapAction, Orch, QuantMethod,
                                F32List, WRITE_ORDER, read_nac, write_nac, iter_operands)
from nac_lab.nac.format.weights import set_weights, dequantize
from nac_lab.nac.format.disasm import listing, summary, make_example
from nac_lab.nac.format import load_canonical_ops

load_canonical_ops()          # a mutated op id in 32..200 would otherwise import the op table (torch) inside a timed case

CASES_PER_SEED = 800
INTERESTING = [0, 1, 2, 3, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 0x7FFFFFFF, 0xFFFFFFFF, 2**63 - 1, 2**64 - 1]


def _tiny(method=QuantMethod.NONE, internal=True, extras=True):
    nac = NacFile(d_model=8)
    nac.cmap[201] = 'aten.relu.default'
    nac.ops.append(Instruction.user_input()); nac.input_names[0] = 'x'
    nac.param_names = {0: 'w', 1: 'b', 2: 'steps'}
    for k in range(3): nac.ops.append(Instruction.param(k))
    mm = nac.add_op(22, 'TW', [('ref', 0), ('ref', 1)])
    ad = nac.add_op(11, 'TB', [('ref', mm), ('ref', 2)])
    rl = nac.add_op(201, 'T', [('ref', ad)])
    sm = nac.add_op(20, 'Tf', [('ref', rl), ('const', 0.5)])
    vw = nac.add_op(17, 'TSbisc', [('ref', sm), ('const', [2, -1]), ('const', True), ('const', 3), ('const', 'x'), ('const', None)])
    nac.constants[40] = F32List([1.5, -2.0])
    nac.ops.append(Instruction.output([vw - len(nac.ops)]))
    nac.n_inputs, nac.n_outputs = 1, 1
    nac.mmap = [MmapRecord(0, [MmapCommand(MmapAction.PRELOAD, 1)]), MmapRecord(4, [MmapCommand(MmapAction.FREE, 1),
                                                                                    MmapCommand(MmapAction.FORWARD, 5)])]
    rng = np.random.default_rng(1)
    set_weights(nac, {'w': rng.standard_normal((4, 70)).astype(np.float32), 'b': rng.standard_normal(70).astype(np.float32),
                      'steps': np.arange(3, dtype=np.int64)}, method, internal)
    if extras:
        nac.rsrc = {'vocab.txt': b'a\nb\n', 'm.bin': bytes(range(10))}; nac.proc = b'TISA\x00\x01\x02'
        nac.orch = Orch(b'\x10\x20\x30\x40', 2, b'\x01\x02\x03')
    return nac


def _sysops():
    nac = _tiny(extras=False)
    nac.ops += [Instruction.control_flow(-2, 1, 1), Instruction.convergence(50, -3, 1, [-1, -2]), Instruction.state(7),
                Instruction.lifted(40), Instruction.output([-1], final=False)]
    return nac


def _reversed():
    nac = _tiny(QuantMethod.INT8_TENSOR); nac.layout = list(reversed(WRITE_ORDER)); return nac


def seed_files():
    out = {f'quant{int(m)}': write_nac(_tiny(m)) for m in QuantMethod}
    out['external'] = write_nac(_tiny(QuantMethod.BLOCK_FP8, internal=False))
    out['sysops'] = write_nac(_sysops())
    out['reversed'] = write_nac(_reversed(), align=1)
    out['example'] = write_nac(make_example())
    return out


SEEDS = seed_files()


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        n = len(b)
        op = rng.randrange(9)
        if n == 0: b += bytes([rng.randrange(256)]); continue
        p = rng.randrange(n)
        if op == 0: b[p] = rng.randrange(256)                                    # random byte
        elif op == 1: b[p] ^= 1 << rng.randrange(8)                              # bit flip
        elif op in (2, 3, 4):                                                     # interesting value over a field
            size = (2, 4, 8)[op - 2]
            v = rng.choice(INTERESTING + [n, n - p, rng.randrange(2**(8*size))]) % 2**(8*size)
            b[p:p + size] = v.to_bytes(size, 'little')
        elif op == 5: del b[rng.randrange(n):]                                    # truncation
        elif op == 6: b[p:p] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))   # insertion
        elif op == 7: del b[p:p + rng.randrange(1, 9)]                            # deletion
        else:                                                                     # duplicated chunk
            q = rng.randrange(n); b[p:p] = b[q:q + rng.randrange(1, 33)]
    return bytes(b)


class Hang(Exception): pass


def _alarm(signum, frame): raise Hang()


def exercise(raw: bytes):
    "What a tool does with a file it accepted; anything but a FormatError here is a bug."
    try: nac = read_nac(raw)
    except FormatError: return 'rejected'
    list(iter_operands(nac)); listing(nac); summary(nac)
    if nac.weights_internal:
        for t in nac.tensors.values(): dequantize(t, nac.quant_method)
    again = read_nac(write_nac(nac))
    assert again.ops == nac.ops and again.constants.keys() == nac.constants.keys()
    return 'accepted'


@pytest.mark.filterwarnings('ignore::RuntimeWarning')       # a mutated scale may overflow float32 on dequantization
@pytest.mark.parametrize('name', sorted(SEEDS))
def test_mutations(name, fuzz_cases):
    data = SEEDS[name]
    assert exercise(data) == 'accepted'
    rng = random.Random(f'nac-fuzz-{name}')
    old = signal.signal(signal.SIGALRM, _alarm)
    stats = {'rejected': 0, 'accepted': 0}
    try:
        for k in fuzz_cases(range(CASES_PER_SEED), f'nac {name}'):
            raw = mutate(data, rng)
            traced = k % 4 == 0                              # tracemalloc on every 4th case (it slows things)
            if traced: tracemalloc.start()
            signal.alarm(5)
            try: stats[exercise(raw)] += 1
            except Hang: pytest.fail(f'{name} case {k}: no answer within 5 s')
            except Exception as ex:
                pytest.fail(f'{name} case {k}: {type(ex).__name__}: {ex} (mutant {raw.hex()})')
            finally:
                signal.alarm(0)
                if traced:
                    _, peak = tracemalloc.get_traced_memory(); tracemalloc.stop()
            if traced: assert peak < 2**20 + 200 * len(raw), f'{name} case {k}: peak {peak} bytes for a {len(raw)}-byte file'
    finally:
        signal.signal(signal.SIGALRM, old)
    assert stats['rejected'] > CASES_PER_SEED // 4, stats   # the mutations do hit structure
    print(name, stats)


def test_case_count():
    assert len(SEEDS) * CASES_PER_SEED >= 5000


def test_huge_counts_do_not_allocate():
    "A count claiming 2**32-1 records in each counted section fails at once, with a LimitError, cheaply."
    from nac_lab.binio import LimitError
    nac = read_nac(SEEDS['quant0'])
    for s in ('MMAP', 'OPS', 'CMAP', 'CNST', 'PERM', 'DATA', 'RSRC'):
        b = bytearray(SEEDS['quant0']); o = nac.sections[s][0]
        b[o + 4:o + 8] = b'\xff\xff\xff\xff'
        tracemalloc.start()
        with pytest.raises(LimitError) as ei: read_nac(bytes(b))
        _, peak = tracemalloc.get_traced_memory(); tracemalloc.stop()
        assert ei.value.offset == o + 4 and peak < 2**20, (s, peak)


@pytest.mark.filterwarnings('ignore::RuntimeWarning')
def test_external_weights_mutations(tmp_path):
    "Mutated .safetensors beside an external-weights .nac: loading raises only FormatError (1,000 cases)."
    from nac_lab.nac.format.weights import external_tensors
    nac = _tiny(QuantMethod.INT8_CHANNEL, internal=False)
    p = nac.save(tmp_path / 'm.nac'); side = p.with_suffix('.safetensors')
    good = side.read_bytes()
    back = read_nac(p)
    rng = random.Random('nac-fuzz-safetensors')
    seen = {'rejected': 0, 'accepted': 0}
    for k in range(1000):
        side.write_bytes(mutate(good, rng))
        try:
            for t in external_tensors(back).values(): dequantize(t, back.quant_method)
            seen['accepted'] += 1
        except FormatError: seen['rejected'] += 1
    assert seen['rejected'] > 250, seen
    side.write_bytes(b'\x10\x27\x00\x00\x00\x00\x00\x00' + b'[' * 10000)      # deep JSON nesting
    with pytest.raises(FormatError): external_tensors(back)


WEIRD = [None, True, False, 0, 1, -1, 2, 3, 64, 2**31, 2**70, -2**70, 0.5, -0.0, 1e40, float('nan'), float('inf'), 'x', '1',
         [], [0], [1, 2], [-1, 2], [70], [2, 35], [[1, 2]], [[1], [2]], [None], ['a'], {}, {'a': 1}]


@pytest.mark.filterwarnings('ignore::RuntimeWarning')
def test_external_quant_metadata_values(tmp_path):
    """Well-formed JSON with wrong *values* in the quantization metadata of every method (nested or scalar scales,
    negative or huge shapes, wrong types): loading raises only FormatError, and whatever is accepted dequantizes
    to the shape the metadata promises (1,500 cases)."""
    from nac_lab.nac.format.weights import external_tensors, _quant_meta, safetensors_bytes
    rng = random.Random('nac-fuzz-quant-json')
    seen = {'rejected': 0, 'accepted': 0}
    for method in (QuantMethod.INT8_TENSOR, QuantMethod.INT8_CHANNEL, QuantMethod.BLOCK_FP8):
        nac = _tiny(method, internal=False, extras=False)
        p = nac.save(tmp_path / f'q{int(method)}.nac'); side = p.with_suffix('.safetensors')
        back = read_nac(p)
        named = {nac.param_names[pid]: t for pid, t in nac.tensors.items()}
        metas = {nac.param_names[pid]: json.loads(m) for pid, t in nac.tensors.items() if (m := _quant_meta(t))}
        for k in range(500):
            name = rng.choice(sorted(metas))
            d = dict(metas[name])
            for key in rng.sample(sorted(d), rng.choice((1, 1, 2))): d[key] = rng.choice(WEIRD)
            side.write_bytes(safetensors_bytes(named, {**{n: json.dumps(m) for n, m in metas.items()}, name: json.dumps(d)}))
            try: ts = external_tensors(back)
            except FormatError: seen['rejected'] += 1; continue
            seen['accepted'] += 1
            for t in ts.values():
                want = tuple(t.orig_shape) if QuantMethod(t.quant) == QuantMethod.BLOCK_FP8 else t.shape
                assert dequantize(t, back.quant_method).shape == want, (name, d)
    assert seen['rejected'] > 500 and seen['accepted'] > 50, seen


# ---- the command line on mutated files (issue 13): typed errors only, bounded time and memory, no stray writes ----

CLI_CASES = 120


@pytest.mark.filterwarnings('ignore::RuntimeWarning')
@pytest.mark.parametrize('name', ['quant0', 'quant3', 'sysops', 'example'])
def test_cli_on_mutated_files(name, tmp_path, monkeypatch):
    """`inspect`, `run`, `schedule check` and `rewrite` on seeded mutants: exit code 0 or 1 (never 3, an internal
    error), one line on stderr for a failure, no case longer than 10 s, a memory limit of 64 MiB for any single
    result (`NAC_LAB_MAX_BYTES`), and nothing written except the requested output."""
    from nac_lab.cli import run_cli
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('NAC_LAB_MAX_BYTES', str(64 << 20))
    np.save(tmp_path / 'x.npy', np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))
    rng = random.Random(f'nac-cli-fuzz-{name}')
    allowed = {'m.nac', 'x.npy', 'out.nac', 'out.safetensors'}
    old = signal.signal(signal.SIGALRM, _alarm)
    codes = {0: 0, 1: 0}
    try:
        for k in range(CLI_CASES):
            raw = mutate(SEEDS[name], rng) if k else SEEDS[name]
            (tmp_path / 'm.nac').write_bytes(raw)
            cmd = [('inspect', 'm.nac', '--ops'), ('run', 'm.nac', '-i', 'x=x.npy'), ('schedule', 'check', 'm.nac'),
                   ('rewrite', 'm.nac', 'out.nac')][k % 4]
            signal.alarm(10)
            try: rc, out, err = run_cli(*cmd)
            except Hang: pytest.fail(f'{name} case {k} {cmd[0]}: no answer within 10 s')
            finally: signal.alarm(0)
            assert rc in (0, 1), f'{name} case {k} {cmd}: exit {rc}: {err} (mutant {raw.hex()})'
            if err:
                # schedule check: rc 1, report on stdout
                assert err.count('\n') == 1 and err.startswith('nac-lab: error: '), (name, k, err)
            codes[rc] += 1
            stray = {p.name for p in tmp_path.iterdir()} - allowed
            assert not stray, f'{name} case {k} {cmd[0]} wrote {stray}'
            assert (tmp_path / 'm.nac').read_bytes() == raw                 # the input is never touched
            for f in ('out.nac', 'out.safetensors'): (tmp_path / f).unlink(missing_ok=True)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert codes[1] > CLI_CASES // 8 and codes[0] > 0, codes
