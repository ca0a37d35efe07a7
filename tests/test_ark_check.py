"""ARK checks: every rule fires on a crafted case, the real files and generated models are clean, seeded
mutations of a 2-rank model are all reported with JSON paths, and `nac-lab ark check` exit codes."""
import json, random
import pytest
from nac_lab.core import data_path
from nac_lab.cli import run_cli
from nac_lab.ark.format import read_ark, ark_text, parse_model
from nac_lab.ark.check import tp_mlp, ArkBuilder
from nac_lab.ark.check import check_model, check_ranks, Diagnostic


def _pair():
    return [read_ark(ark_text(tp_mlp(r)[0])) for r in (0, 1)]


def test_clean_inputs():
    for f in sorted(data_path('ark').glob('*.json')):
        assert [d for d in check_model(read_ark(f)) if d.severity == 'error'] == []
    assert check_ranks(_pair()) == []


def _codes(mutate, doc=None):
    d = json.loads(json.dumps(doc or json.loads((data_path('ark') / 'tutorial_model_877b0e63_op.json').read_text())))
    mutate(d)
    return {x.code for x in check_model(parse_model(d), 'f.json')}


def T(d, i, k='ReadTensors', j=0): return d['Nodes'][i]['Op'][k][j]

CASES = {
    'node.id': lambda d: d['Nodes'][2].update(Id=7),
    'node.producers': lambda d: d['Nodes'][4].update(ProducerNodeIds=[2]),       # node 4 reads node 3's result: a derived edge missing
    'node.consumers': lambda d: d['Nodes'][0].update(ConsumerNodeIds=[1]),
    'node.cycle': lambda d: (d['Nodes'][0].update(ProducerNodeIds=[1]), d['Nodes'][1].update(ConsumerNodeIds=[2, 0])),
    'op.results': lambda d: d['Nodes'][1]['Op'].update(ResultTensors=[]),
    'op.type': lambda d: d['Nodes'][1]['Op'].update(Type='Frobnicate'),
    'op.name': lambda d: d['Nodes'][1]['Op'].update(Name='matmul'),
    'tensor.id': lambda d: T(d, 1).update(Offsets=[0, 0, 1], Strides=[1, 512, 11009]),
    'tensor.rank': lambda d: [T(d, 0).update({k: [1, 1] + T(d, 0)[k]}) for k in ('Shape', 'Strides', 'Offsets', 'PaddedShape')],
    'tensor.dims': lambda d: T(d, 0).update(Offsets=[0, 0]),
    'tensor.bounds': lambda d: T(d, 0).update(PaddedShape=[1, 600, 4096]),
    'buffer.copies': lambda d: T(d, 1)['Buffer'].update(Rank=3),
    'buffer.tags': lambda d: [T(d, 0, k, 0)['Buffer'].update(SendTags=[[1, 5], [1, 2]]) for k in ('ReadTensors',)],
    'arg.missing': lambda d: d['Nodes'][0]['Op']['Args'].pop('TransposeOther'),
    'arg.type': lambda d: d['Nodes'][0]['Op']['Args'].update(TransposeOther={'INT': 1}),
    'arg.value': lambda d: d['Nodes'][0]['Op']['Args'].update(ShapeMNK={'DIMS': [1, 2, 3]}),
}


@pytest.mark.parametrize('code', sorted(CASES))
def test_each_rule_fires(code):
    assert code in _codes(CASES[code])


def test_buffer_dtype_reinterpretation_is_a_warning():
    b = ArkBuilder()
    x = b.tensor((8,), 'FP32')
    raw = b.tensor((32,), 'UINT8', buffer=x.buffer)        # the same 32 bytes seen as bytes
    b.relu(x); b.copy(raw)
    diags = check_model(b.model())
    assert [(d.code, d.severity) for d in diags] == [('buffer.dtype', 'warning')]
    assert 'FP32, UINT8' in diags[0].message


def test_reduce_and_transpose_args():
    b = ArkBuilder()
    x = b.tensor((2, 3, 4))
    b.reduce('ReduceMax', x, 2); b.transpose(x, (2, 0, 1))
    m = b.model()
    assert check_model(m) == []
    m.nodes[0].ops[0].args['Axis'].value = 3
    m.nodes[1].ops[0].args['Permutation'].value = (0, 1, 1)
    msgs = [x.message for x in check_model(m)]
    assert any('Axis 3 is not an axis' in s for s in msgs) and any('not a permutation of 0..2' in s for s in msgs)


def test_cross_rank_mutations_all_reported():
    "Seeded: change one tag, rank or size somewhere in a 2-rank model; the checker must report an error."
    rng = random.Random(5)
    for trial in range(40):
        ms = _pair()
        kind = rng.choice(['tag', 'rank', 'world', 'size', 'dup'])
        comm = [(r, o) for r, m in enumerate(ms) for _, _, o in m.ops() if o.type in ('Send', 'Recv')]
        r, o = rng.choice(comm)
        if kind == 'tag':
            b = o.write[0].buffer if o.type == 'Recv' else o.read[0].buffer
            if o.type == 'Recv': b.recv_tags = [(p, t + 1) for p, t in b.recv_tags]
            else: b.send_tags = [(p, t + 1) for p, t in b.send_tags]
        elif kind == 'rank': ms[1].rank = 0
        elif kind == 'world': ms[0].world_size = 3
        elif kind == 'size':
            for t in (*o.write, *o.result): t.shape = (2, 8)
        else: ms = [ms[0], ms[0]]
        errs = [d for d in check_ranks(ms, ['a.json', 'b.json']) if d.severity == 'error']
        assert errs, (trial, kind)
        assert all(isinstance(d, Diagnostic) and str(d).split(':')[0] in ('a.json', 'b.json') for d in errs)


def test_four_rank_all_to_all_tags():
    ms = []
    for r in range(4):
        b = ArkBuilder(r, 4); x = b.tensor((3,))
        for q in range(4):
            if q != r: b.send(x, q, 10 * r + q)
        for q in range(4):
            if q != r: b.recv(b.tensor((3,)), q, 10 * q + r)
        ms.append(b.model())
    assert check_ranks(ms) == []
    assert {d.code for d in check_ranks(ms[:3])} == {'rank.missing'}


def test_cli_exit_codes(tmp_path):
    for r, m in enumerate(_pair()): (tmp_path / f'r{r}.json').write_text(ark_text(m))
    rc, out, err = run_cli('ark', 'check', tmp_path / 'r0.json', tmp_path / 'r1.json'); assert rc == 0 and 'ok' in out
    rc, out, err = run_cli('ark', 'check', tmp_path / 'r1.json'); assert rc == 1 and 'error[rank.missing]' in out
    (tmp_path / 'bad.json').write_text('{"Rank": 0}')
    rc, out, err = run_cli('ark', 'check', tmp_path / 'bad.json'); assert rc == 1 and "missing key 'WorldSize'" in err


def test_bulk_check_never_passes_a_model_the_walk_faults():
    ("`check_model` first tries the column-wise `_fast_ok`; on seeded damage of a tagged 2-rank model it must say True only where the "
     "precise walk finds nothing, and the CASES above all make it say False.")
    import nac_lab.ark.check as C
    from nac_lab.bench.ark import gen_rank
    def walk(m):                                   # the precise walk alone
        ok, C._fast_ok = C._fast_ok, lambda m: False
        try: return check_model(m, 'f.json')
        finally: C._fast_ok = ok
    text = ark_text(gen_rank(0, 60))
    assert C._fast_ok(read_ark(text)) and walk(read_ark(text)) == []
    rng = random.Random(5)
    edits = [lambda m, o, t: setattr(t, 'shape', t.shape[:1] + (t.shape[1] + 1,)),
             lambda m, o, t: setattr(t, 'padded_shape', tuple(x + 1 for x in t.padded)),
             lambda m, o, t: setattr(t, 'offsets', (1,) + t.offsets[1:]),
             lambda m, o, t: setattr(t, 'dtype', 'FP16'),
             lambda m, o, t: setattr(t, 'id', t.id + 1),
             lambda m, o, t: setattr(t.buffer, 'id', t.buffer.id + 1),
             lambda m, o, t: setattr(t.buffer, 'send_tags', [(1, 3), (1, 2)]),
             lambda m, o, t: setattr(t.buffer, 'rank', 1),
             lambda m, o, t: setattr(o, 'name', m.nodes[0].ops[0].name),
             lambda m, o, t: setattr(o, 'type', 'Frob'),
             lambda m, o, t: o.result.append(t),
             lambda m, o, t: o.args.clear(),
             lambda m, o, t: setattr(o, 'is_virtual', True),
             lambda m, o, t: m.nodes[rng.randrange(len(m.nodes))].producers.append(rng.randrange(len(m.nodes))),
             lambda m, o, t: m.nodes[rng.randrange(len(m.nodes))].consumers.clear(),
             lambda m, o, t: m.nodes.reverse()]
    faulted = 0
    for _ in range(120):
        m = read_ark(text)
        i = rng.randrange(len(m.nodes)); o = m.nodes[i].ops[0]
        ts = o.read + o.write + o.result
        rng.choice(edits)(m, o, rng.choice(ts) if ts else m.nodes[0].ops[0].read[0])
        w = walk(m)
        faulted += bool(w)
        if C._fast_ok(m): assert w == [], w[:3]
        else: assert check_model(m, 'f.json') == w
    assert faulted > 80
    for code, mutate in CASES.items():
        d = json.loads((data_path('ark') / 'tutorial_model_877b0e63_op.json').read_text()); mutate(d)
        assert not C._fast_ok(parse_model(d)), code


def test_huge_tensor_refused_by_check_and_run(tmp_path):
    "A tensor of shape [1, 4, 2**40] used to pass `ark check` and then fail `ark run` with a MemoryError (exit 3)."
    d = json.loads((data_path('ark') / 'tutorial_model_877b0e63_op.json').read_text())
    for n in d['Nodes']:
        for k in ('ReadTensors', 'WriteTensors', 'ResultTensors'):
            for t in n['Op'][k]:
                if t['Id'] == 0: t.update(Shape=[1, 4, 2**40], Strides=[1, 4, 2**40], Offsets=[0, 0, 0], PaddedShape=[1, 4, 2**40])
    assert 'buffer.size' in {x.code for x in check_model(parse_model(d), 'f.json')}
    f = tmp_path / 'huge.json'; f.write_text(json.dumps(d))
    rc, out, err = run_cli('ark', 'check', f)
    assert rc == 1 and 'error[buffer.size]' in out + err and 'more than the memory budget' in out + err
    rc, out, err = run_cli('ark', 'run', f, '--no-check', '--output', tmp_path / 'o.npz')
    assert rc == 1 and 'above the limit' in err and 'Traceback' not in err, (rc, err)


def test_show_escapes_names_from_the_file(tmp_path):
    d = json.loads((data_path('ark') / 'tutorial_model_877b0e63_op.json').read_text())
    d['Nodes'][0]['Op']['Name'] = 'mm\x1b[2J\nfake row'
    f = tmp_path / 'm.json'; f.write_text(json.dumps(d))
    rc, out, err = run_cli('ark', 'show', f)
    assert rc == 0 and '\x1b' not in out and '\\x1b' in out and not any(l.startswith('fake row') for l in out.split('\n'))


def _compressed():
    """A file shaped like ARK's `compress()` output, built by hand: x -> relu (node 0); an identity of relu's
    result was removed, and its consumer (node 2, an add reading x and a fresh tensor) inherited the identity's
    dependency on node 0 as an ordering edge; node 1 (exp of x) is a plain derived edge-free node."""
    b = ArkBuilder()
    x = b.tensor((2, 4)); y = b.tensor((2, 4))
    b.relu(x); b.exp(x); b.add(x, y)
    m = b.model()
    assert [n.producers for n in m.nodes] == [[], [], []]            # no derived edge at all
    m.nodes[2].producers.append(0); m.nodes[0].consumers.append(2)     # the inherited edge, listed symmetrically
    return m


def test_compressed_inherited_edge_passes():
    assert check_model(_compressed()) == []


def test_inherited_edge_must_be_symmetric_and_backward():
    m = _compressed(); m.nodes[0].consumers.clear()                    # producer lists it, consumer list does not
    assert [(d.path, d.code) for d in check_model(m)] == [('Nodes[0].ConsumerNodeIds', 'node.consumers')]
    m = _compressed(); m.nodes[0].producers.append(2); m.nodes[2].consumers.append(0)   # a forward extra edge
    codes = {(d.path, d.code) for d in check_model(m)}
    assert ('Nodes[0].ProducerNodeIds', 'node.order') in codes and ('Nodes', 'node.cycle') in codes


def test_missing_derived_edge_is_an_error():
    b = ArkBuilder()
    x = b.tensor((2, 4))
    b.exp(b.relu(x))                                                   # node 1 reads node 0's result
    m = b.model()
    m.nodes[1].producers.clear(); m.nodes[0].consumers.clear()        # symmetric, but the derived edge is gone
    assert [(d.path, d.code) for d in check_model(m)] == [('Nodes[1].ProducerNodeIds', 'node.producers')]


def test_four_rank_all_reduce_with_inherited_edges_passes():
    "4 ranks, each sends its partial to every other and adds what it receives, with compress()-style ordering edges."
    models = []
    for r in range(4):
        b = ArkBuilder(r, 4)
        part = b.relu(b.tensor((2, 4)))
        acc = part
        for k in range(4):
            if k == r: continue
            b.send_done(b.send(part, k, 10 * r + k))
        for k in range(4):
            if k == r: continue
            acc = b.add(acc, b.recv(b.tensor((2, 4)), k, 10 * k + r))
        m = b.model()
        recvs = [i for i, n in enumerate(m.nodes) if n.ops[0].type == 'Recv']
        for i in recvs:                                               # each Recv inherits the ordering edge on the last SendDone
            p = recvs[0] - 1
            if p not in m.nodes[i].producers: m.nodes[i].producers.append(p); m.nodes[p].consumers.append(i)
        models.append(read_ark(ark_text(m)))
    assert check_ranks(models) == []


