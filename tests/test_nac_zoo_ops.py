"""Op-level coverage of the canonical table: small modules that each exercise a few canonical ops the zoo
models do not, compiled, saved, loaded and run; outputs must match eager PyTorch within 1e-5 and the
listed canonical ops must appear in the instruction stream (not as raw ATen names in CMAP)."""
import pytest, torch, torch.nn.functional as F
from nac_lab.nac.compiler.compile import compile as nac_compile, load

class Fn(torch.nn.Module):
    def __init__(self, f): super().__init__(); self.f = f
    def forward(self, *xs): return self.f(*xs)

X = lambda *s: torch.randn(*s, generator=torch.Generator().manual_seed(sum(s)))
CASES = [
    ('layout', lambda x: x.permute(0, 2, 1).reshape(2, -1).unsqueeze(0).squeeze(0).flatten(), (X(2, 3, 4),), ['nac.permute', 'nac.view']),
    ('slice_select', lambda x: x[:, 1:3, ::2].select(0, 1) + x.narrow(1, 0, 2)[0, :, :2], (X(2, 4, 4),), ['nac.slice', 'nac.select']),
    ('cat_split_chunk', lambda x: torch.cat(list(x.split(2, 1)) + list(x.chunk(2, 1)), 1), (X(2, 4),), ['nac.cat', 'nac.split']),
    ('stack_unbind', lambda x: torch.stack(x.unbind(1), 0), (X(3, 2),), ['nac.stack', 'nac.unbind']),
    ('reductions', lambda x: x.sum(1) + x.mean(1) + x.amax(1) + x.amin(1) + x.argmax(1) + x.max(1).values + x.var(1), (X(3, 5),),
     ['nac.sum', 'nac.mean', 'nac.amax', 'nac.argmax', 'nac.max_dim', 'nac.var_dim']),
    ('activations', lambda x: F.leaky_relu(x, 0.1) + F.elu(x) + torch.sigmoid(x) + torch.tanh(x) + F.silu(x) + F.hardtanh(x)
     + F.log_softmax(x, -1) + F.gelu(x) + F.mish(x), (X(4, 6),), ['nac.leaky_relu', 'nac.elu', 'nac.sigmoid', 'nac.log_softmax',
                                                                  'nac.mish']),
    ('math', lambda x: x.abs().sqrt() + x.exp() + (x.abs() + 1).log() + x.clamp(-0.5, 0.5) + x.sin() * x.cos() + torch.erf(x)
     + (x.abs() + 1).reciprocal() + torch.maximum(x, -x) + torch.minimum(x, x * 2) + x.pow(3), (X(5,),), ['nac.sqrt', 'nac.clamp',
                                                                                                          'nac.erf']),
    ('compare_where', lambda x: torch.where(x > 0, x, x * 0.5) + (x <= 0.1).float() + (x == x).float() + (x != 0).float()
     + (x < 0.3).float() + (x >= -0.3).float() + x.masked_fill(x < -1, 0.0), (X(7,),), ['nac.where', 'nac.gt', 'nac.le',
                                                                                        'nac.masked_fill']),
    ('logical', lambda x: ((x > 0) & (x < 1) | ~(x > -1)).float(), (X(6,),), ['nac.gt', 'nac.lt', 'nac.bitwise_and', 'nac.bitwise_or']),
    ('bitwise_int', lambda i: (i & 6) + (i | 1) + (i ^ i.flip(0)), (torch.tensor([3, 5, 12]),), ['nac.bitwise_and', 'nac.bitwise_or',
                                                                                                 'nac.bitwise_xor']),
    ('conv2d_dilated_grouped', lambda x, w, b: F.conv2d(x, w, b, 1, 2, 2, 2), (X(1, 4, 9, 9), X(6, 2, 3, 3), X(6)), ['nac.conv2d']),
    ('batch_norm_alone', lambda x, m, v, w, b: F.batch_norm(x, m, v.abs() + 0.5, w, b, training=False, eps=1e-3), (X(3, 4), X(4),
                                                                                                                   X(1, 4)[0], X(2, 4)[0],
                                                                                                                       X(4, 4)[1]),
     ['nac.batch_norm_infer']),
    ('transpose_gelu_tanh_softmax', lambda x: F.softmax(F.gelu(x.transpose(0, 1), approximate='tanh'), -1) + torch.relu(x).t(), (X(3, 5),),
     ['nac.transpose', 'nac.gelu', 'nac.softmax', 'nac.relu']),
    ('constructors', lambda x: x + torch.arange(4.0) + torch.zeros(4) + torch.ones(4) + torch.full((4,), 2.0)
     + torch.zeros_like(x) + torch.ones_like(x) + torch.full_like(x, 3.0), (X(3, 4),), ['nac.add']),
    ('cumsum_tril', lambda x: x.cumsum(1).tril() + x.triu(1) + x.flip(0) + x.roll(1, 1), (X(4, 4),), ['nac.cumsum', 'nac.tril',
                                                                                                      'nac.flip']),
    ('gather_index', lambda x, i: x.gather(1, i) + x.index_select(1, i[0]) + x[:, i[0]], (X(3, 4), torch.tensor([[0, 2], [1, 1], [3, 0]])),
     ['nac.gather', 'nac.index_select', 'nac.index']),
    ('pad', lambda x: F.pad(x, (1, 2)) + F.pad(x, (1, 2), value=3.0), (X(2, 3),), ['nac.pad']),
    ('conv1d_dilated_grouped', lambda x, w: F.conv1d(x, w, None, 1, 2, 2, 2), (X(2, 4, 9), X(4, 2, 3)), ['nac.conv1d']),
    ('pooling', lambda x: F.avg_pool2d(x, 2) + F.max_pool2d(x, 2) + F.adaptive_max_pool2d(x, 4) + F.adaptive_avg_pool2d(x, 4),
     (X(1, 2, 8, 8),), ['nac.avg_pool2d', 'nac.max_pool2d', 'nac.adaptive_avg_pool2d']),
    ('pool1d', lambda x: F.avg_pool1d(x, 2) + F.max_pool1d(x, 2), (X(1, 2, 8),), ['nac.avg_pool1d']),
    ('interpolate', lambda x: F.interpolate(x, scale_factor=2, mode='nearest') + F.interpolate(x, size=(8, 8), mode='bilinear'),
     (X(1, 2, 4, 4),), ['nac.upsample_nearest2d', 'nac.upsample_bilinear2d']),
    ('norms', lambda x, w: F.layer_norm(x, (6,), w, w) + F.rms_norm(x, (6,), w) + F.group_norm(x.reshape(2, 6, 1), 3).reshape(2, 6),
     (X(2, 6), X(6)), ['nac.layer_norm', 'nac.rms_norm', 'nac.group_norm']),
    ('sdpa_mask', lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), (X(1, 2, 4, 8), X(1, 2, 5, 8), X(1, 2, 5, 8),
                                                                                            X(4, 5) > 0),
     ['nac.sdpa']),
    ('bmm_addmm', lambda a, b, c: torch.bmm(a, b).sum(0) + torch.addmm(c, a[0], b[0]) + a[0] @ b[0], (X(2, 3, 4), X(2, 4, 5), X(3, 5)),
     ['nac.matmul', 'nac.addmm']),
    ('embedding_cast', lambda w, i: F.embedding(i, w).to(torch.float64).sum(-1).float() + i.float(), (X(10, 3),
                                                                                                      torch.tensor([[1, 2], [3, 9]])),
     ['nac.embedding', 'nac.to_copy']),
    ('repeat_expand', lambda x: x.repeat(2, 1) + x.expand(2, 2, 3)[0].repeat(2, 1) + x.repeat_interleave(2, 0), (X(2, 3),), ['nac.repeat']),
]

@pytest.mark.parametrize('name,f,args,expect', CASES, ids=[c[0] for c in CASES])
def test_op_case(name, f, args, expect, tmp_path):
    m = Fn(f)
    nm = nac_compile(m, args)
    loaded = load(nm.save(tmp_path / 'm.nac'))
    out = loaded.run(*args)
    ref = m(*args)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for o, r in zip(out, ref):
        assert o.dtype == r.dtype and o.shape == r.shape
        assert float((o.double() - r.double()).abs().max()) <= 1e-5
    names = set(loaded.op_counts())
    missing = [e for e in expect if e not in names]
    assert not missing, f'{name}: expected canonical ops {missing}; got {sorted(names)}; CMAP {loaded.nac.cmap}'
    assert not loaded.nac.cmap, f'{name}: ops left as raw ATen names: {loaded.nac.cmap}'   # every family here is canonical

def test_constructors_without_folding(tmp_path):
    "arange/zeros/ones/full(_like) fold away when optimized; unoptimized they must be canonical instructions that run."
    f, args = next((c[1], c[2]) for c in CASES if c[0] == 'constructors')
    m = Fn(f)
    loaded = load(nac_compile(m, args, optimize=False).save(tmp_path / 'c.nac'))
    assert torch.equal(loaded.run(*args)[0], m(*args))
    names = loaded.op_counts()
    for op in ('nac.arange', 'nac.zeros', 'nac.ones', 'nac.full', 'nac.zeros_like', 'nac.ones_like', 'nac.full_like'):
        assert names.get(op) == 1, (op, names)
    assert not loaded.nac.cmap

@torch.library.custom_op('nac_lab_test::twice', mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor: return x * 2

@_twice.register_fake
def _(x): return torch.empty_like(x)

class _UsesCustom(torch.nn.Module):
    def __init__(self): super().__init__(); self.lin = torch.nn.Linear(3, 3)
    def forward(self, x): return torch.ops.nac_lab_test.twice(self.lin(x))

class _Outer(torch.nn.Module):
    def __init__(self): super().__init__(); self.block = _UsesCustom()
    def forward(self, x): return self.block(x) + 1

def test_non_aten_op_is_a_compile_error():
    "A custom (non-aten) operator used to compile into a file no runtime could load; now compile names module path, node and op."
    from nac_lab.nac.compiler.optimize import NacCompileError
    with pytest.raises(NacCompileError) as e:
        nac_compile(_Outer(), (torch.randn(2, 3),))
    msg = str(e.value)
    assert msg.startswith("_Outer.block: node 'twice' (nac_lab_test.twice.default)") and 'is not an ATen operator' in msg, msg
