"""Input signatures end to end (compile -> file -> run/CLI/inspect/graph) and `compile(tokenizer=)`: the embedded
tokenizer gives the ids of HuggingFace `tokenizers` for a tokenizer trained here (no downloads)."""
import json
import numpy as np
import pytest
import torch
import nac_lab
from nac_lab.cli import run_cli
from nac_lab.nac.format import read_nac, write_nac
from nac_lab.nac.format.input_signature import signature_of, InputSignatureError, SIGNATURE_NAME

class Two(torch.nn.Module):
    "Two inputs sharing the dynamic batch; the second one's length is twice the first one's feature size."
    def __init__(self):
        super().__init__(); torch.manual_seed(0); self.fc = torch.nn.Linear(3, 2)
    def forward(self, x, ids): return self.fc(x).sum(-1) + ids.sum(-1).float()

@pytest.fixture(scope='module')
def two(tmp_path_factory):
    b = torch.export.Dim('batch', min=1, max=32)
    m = nac_lab.compile(Two().eval(), (torch.randn(4, 3), torch.ones(4, 6, dtype=torch.int64)), dynamic_shapes=({0: b}, {0: b}))
    p = m.save(tmp_path_factory.mktemp('sig') / 'two.nac')
    return m, p

def test_recorded(two):
    m, p = two
    sig = signature_of(read_nac(p))
    assert [(s.name, s.dtype, s.shape) for s in sig.inputs] == [('x', 'float32', ['batch', 3]), ('ids', 'int64', ['batch', 6])]
    assert sig.dims == {'batch': [1, 32]}
    raw = json.loads(read_nac(p).rsrc[SIGNATURE_NAME])
    assert raw['format'] == 'nac_lab.signature' and raw['inputs'][0]['at'] == 0

def test_run_checks(two):
    m, p = two
    x, ids = torch.randn(5, 3), torch.ones(5, 6, dtype=torch.int64)
    with torch.no_grad(): ref = Two().eval()(x, ids)
    assert torch.allclose(nac_lab.load(p).run(x, ids)[0], ref, atol=1e-6)
    cases = [((torch.zeros(3, dtype=torch.int64), ids), 'input x: expected float32 [batch, 3], got int64 [3]'),
             ((x, torch.ones(4, 6, dtype=torch.int64)), 'input ids: expected int64 [batch, 6], got int64 [4, 6] (batch = 5 from input x)'),
             ((torch.zeros(33, 3), torch.ones(33, 6, dtype=torch.int64)), 'batch = 33 is outside 1..32'),
             ((x, ids.to(torch.int32)), 'input ids: expected int64 [batch, 6], got int32 [5, 6]')]
    for args, msg in cases:
        with pytest.raises(InputSignatureError, match=None) as ei: nac_lab.load(p).run(*args)
        assert msg in str(ei.value) and '\n' not in str(ei.value)

def test_cli_run_one_line(two, tmp_path):
    m, p = two
    np.save(tmp_path / 'x.npy', np.zeros((2, 3), np.float64)); np.save(tmp_path / 'ids.npy', np.ones((2, 6), np.int64))
    rc, out, err = run_cli('run', p, '--input', f'x={tmp_path / "x.npy"}', '--input', f'ids={tmp_path / "ids.npy"}')
    assert rc != 0 and 'input x: expected float32 [batch, 3], got float64 [2, 3]' in err
    np.save(tmp_path / 'x.npy', np.zeros((2, 3), np.float32))
    rc, out, err = run_cli('run', p, '--input', f'x={tmp_path / "x.npy"}', '--input', f'ids={tmp_path / "ids.npy"}')
    assert rc == 0, err

def test_reference_style_file_runs_unchecked(two, tmp_path):
    m, p = two
    nac = read_nac(p); nac.rsrc = None
    q = tmp_path / 'plain.nac'; q.write_bytes(write_nac(nac))
    assert signature_of(read_nac(q)) is None
    out = nac_lab.load(q).run(torch.zeros(2, 3), torch.ones(2, 6, dtype=torch.int64))[0]   # unchecked, as before
    assert out.shape == (2,)

def test_inspect_and_graph(two, tmp_path):
    m, p = two
    rc, out, err = run_cli('inspect', p)
    assert rc == 0 and 'signature: input x (v0): float32 [batch, 3]' in out and 'batch in 1..32' in out
    rc, out, err = run_cli('inspect', p, '--json')
    assert json.loads(out)['signature']['inputs'][1] == {'name': 'ids', 'at': 1, 'dtype': 'int64', 'shape': ['batch', 6]}
    from nac_lab.nac.format.disasm import graph
    src = graph(read_nac(p)).source
    assert 'label="float32 [batch, 3]"' in src and 'label="int64 [batch, 6]"' in src

def test_auto_dims_named_by_input():
    m = nac_lab.compile(Two().eval(), (torch.randn(4, 3), torch.ones(4, 6, dtype=torch.int64)),
                        dynamic_shapes=({0: torch.export.Dim.AUTO}, {0: torch.export.Dim.AUTO}))
    sig = signature_of(m.nac)
    assert [s.shape for s in sig.inputs] == [['x_dim0', 3], ['x_dim0', 6]] and sig.dims == {'x_dim0': [1, None]}
    static = nac_lab.compile(Two().eval(), (torch.randn(4, 3), torch.ones(4, 6, dtype=torch.int64)))
    assert [s.shape for s in signature_of(static.nac).inputs] == [[4, 3], [4, 6]]
    assert signature_of(nac_lab.compile(Two().eval(), (torch.randn(4, 3), torch.ones(4, 6, dtype=torch.int64)),
                                        signature=False).nac) is None

# ---- compile(tokenizer=) ----

tokenizers = pytest.importorskip('tokenizers')

def wordpiece(path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, decoders, processors, trainers
    t = Tokenizer(models.WordPiece(unk_token='[UNK]'))
    t.normalizer = normalizers.BertNormalizer(lowercase=True)
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.decoder = decoders.WordPiece()
    corpus = [f'the plan runs {k} times, then the model {w} the tokens.' for k in range(50) for w in ('reads', 'writes', 'counts')]
    t.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=300, special_tokens=['[UNK]', '[CLS]', '[SEP]'],
                                                            show_progress=False))
    t.post_processor = processors.BertProcessing(('[SEP]', t.token_to_id('[SEP]')), ('[CLS]', t.token_to_id('[CLS]')))
    t.save(str(path))
    return t

def test_compile_with_tokenizer(tmp_path):
    hf = wordpiece(tmp_path / 'tokenizer.json')
    lin = torch.nn.Linear(4, 2).eval()
    m = nac_lab.compile(lin, (torch.randn(1, 4),), tokenizer=tmp_path / 'tokenizer.json')
    p = m.save(tmp_path / 'lm.nac')
    nac = read_nac(p)
    assert nac.proc and {'vocab.b', 'vidx.b', SIGNATURE_NAME} <= set(nac.rsrc)
    texts = ['The plan runs 7 times.', 'then the model COUNTS tokens', 'unknown zebra words 12345']
    from nac_lab.nac.tokenizer.tisa import from_nac
    t = from_nac(nac)
    for s in texts:
        want = hf.encode(s).ids
        assert t.encode(s) == want
        rc, out, err = run_cli('tokenize', p, s)
        assert rc == 0 and [int(v) for v in out.split()] == want, err
    x = torch.randn(1, 4)
    with torch.no_grad(): assert torch.allclose(nac_lab.load(p).run(x)[0], lin(x), atol=1e-6)   # the model itself is unchanged

def test_derived_dimension():
    class Rep(torch.nn.Module):
        def forward(self, x, y): return x.sum(1).repeat(2) + y
    b = torch.export.Dim('batch', min=1, max=16)
    m = nac_lab.compile(Rep(), (torch.randn(4, 3), torch.randn(8)), dynamic_shapes=({0: b}, {0: 2 * b}))
    sig = signature_of(m.nac)
    assert [s.shape for s in sig.inputs] == [['batch', 3], ['2*batch']] and sig.dims == {'batch': [1, 16]}
    x, y = torch.randn(3, 3), torch.randn(6)
    assert torch.allclose(m.run(x, y)[0], x.sum(1).repeat(2) + y)
    with pytest.raises(InputSignatureError, match=r'input y: expected float32 \[2\*batch\], got float32 \[7\] \(2\*batch = 6\)'):
        m.run(x, torch.randn(7))
