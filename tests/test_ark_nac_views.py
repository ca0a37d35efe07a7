"""ARK <-> NAC with views beyond ARK's 4 dimensions: the zoo's Attention (a 5-d qkv view) round trips through
files, the checker, the executor and to-nac; random 5-d permutations/selections fold or are refused; what
cannot be expressed at all is refused with the reason."""
import itertools, random
import numpy as np
import pytest
import torch, torch.nn as nn
from nac_lab.cli import run_cli
from nac_lab.nac.compiler.compile import compile as nac_compile, load as nac_load
from nac_lab.ark.format import read_ark
from nac_lab.ark.nac import from_nac, to_nac, load_weights, ArkNacError


@pytest.mark.parametrize('heads,causal,shape', [(2, True, (1, 4, 16)), (4, False, (2, 3, 16))])
def test_zoo_attention_5d_view_round_trip(heads, causal, shape, tmp_path):
    ("from-nac folds the 5-d [b, t, 3, h, d] view into ARK windows + Transpose; the checker accepts the file; the executor and the NAC "
     "program made back from it compute what the original computes.")
    from nac_lab.nac.compiler.zoo import Attention
    from nac_lab.ark.exec import ArkExecutor
    torch.manual_seed(0)
    mod = Attention(16, heads, causal).eval()
    nac_compile(mod, (torch.zeros(shape),)).save(tmp_path / 'a.nac')
    rc, out, err = run_cli('ark', 'from-nac', tmp_path / 'a.nac', '-o', tmp_path / 'm.json', '--shape',
                           'x=' + ','.join(map(str, shape))); assert rc == 0, err
    rc, out, err = run_cli('ark', 'check', tmp_path / 'm.json'); assert rc == 0, out
    m = read_ark(tmp_path / 'm.json'); w, meta = load_weights(tmp_path / 'm.safetensors')
    assert max(len(t.shape) for _, _, o in m.ops() for t in o.read + o.write + o.result) <= 4
    assert any(o.is_virtual and any(o.result[0].offsets) for _, _, o in m.ops())            # windows of the qkv buffer
    rc, out, err = run_cli('ark', 'to-nac', tmp_path / 'm.json', '-o', tmp_path / 'b.nac'); assert rc == 0, err
    xi = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(): want = mod(xi).numpy()
    a, b = nac_load(tmp_path / 'a.nac').run(xi)[0].numpy(), nac_load(tmp_path / 'b.nac').run(xi)[0].numpy()
    ex = ArkExecutor(m)
    for tid, arr in w.items(): ex.set(tid, arr)
    ex.set(meta['inputs']['x'], xi.numpy()); ex.run()
    np.testing.assert_allclose(a, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ex.get(meta['outputs'][0]), a, rtol=1e-5, atol=1e-6)


class _V(nn.Module):
    def __init__(s, perm, k): super().__init__(); s.perm, s.k = perm, k
    def forward(s, x):
        y = (x * 2.0).view(2, 3, 2, 2, 4).permute(*s.perm)
        return torch.relu(y.unbind(0)[s.k]) + 1.0


def test_random_5d_views_fold_or_are_refused():
    ("Twelve seeded permutations of a 5-d view, one slice unbound: each either round-trips (the result against torch) or is refused with "
     "the fold message.")
    rng, g = random.Random(4), torch.Generator().manual_seed(0)
    folded = 0
    for perm in rng.sample(list(itertools.permutations(range(5))), 12):
        mod = _V(perm, rng.randrange((2, 3, 2, 2, 4)[perm[0]])).eval()
        x = torch.randn(6, 16, generator=g)
        nm = nac_compile(mod, (torch.zeros(6, 16),))
        try: m, w, meta = from_nac(nm.interpreter, {'x': (6, 16)})
        except ArkNacError as ex:
            assert 'cannot be written as ARK tensors of at most 4 dimensions' in str(ex); continue
        folded += 1
        with torch.no_grad(): want = mod(x).numpy()
        np.testing.assert_allclose(to_nac(m, w, meta).run(x)[0].numpy(), want, rtol=1e-6, atol=1e-6)
    assert folded >= 6


def test_impossible_views_and_ops_are_refused():
    from nac_lab.nac.compiler.zoo import GPT2Block
    class Reverse6d(nn.Module):
        def forward(s, x): return torch.relu(x.view(2, 2, 2, 2, 2, 2).permute(5, 4, 3, 2, 1, 0).reshape(8, 8))
    z = nac_compile(Reverse6d().eval(), (torch.zeros(8, 8),))
    with pytest.raises(ArkNacError,
                       match=r'view of shape \[2, 2, 2, 2, 2, 2\] with element strides \[1, 2, 4, 8, 16, 32\]'): from_nac(z.interpreter,
                                                                                                                          {'x': (8, 8)})
    gb = nac_compile(GPT2Block(16, 2).eval(), (torch.zeros(1, 4, 16), torch.ones(1, 1, 4, 4)))
    with pytest.raises(ArkNacError, match='nac.eq has no ARK equivalent'): from_nac(gb.interpreter, {'x': (1, 4, 16), 'mask': (1, 1, 4, 4)})


def test_zoo_llama_block_cat_and_repeat_interleave_round_trip(tmp_path):
    ("The zoo's LlamaBlock (three inputs; rotate_half = split + neg + cat; grouped-query attention = repeat_interleave): through files, "
     "the checker, the executor and to-nac, against the original NAC program; inputs keep the program's order.")
    from nac_lab.nac.compiler.zoo import LlamaBlock
    from nac_lab.ark.nac import save_ark
    from nac_lab.ark.exec import ArkExecutor
    from nac_lab.ark.check import check_model
    torch.manual_seed(0)
    xs = (torch.zeros(1, 5, 16), torch.zeros(5, 4), torch.zeros(5, 4))
    nm = nac_compile(LlamaBlock(16, 4, 2, 32).eval(), xs)
    m, w, meta = from_nac(nm.interpreter, {'x': (1, 5, 16), 'cos': (5, 4), 'sin': (5, 4)})
    types = [o.type for _, _, o in m.ops()]
    assert types.count('Copy') >= 4 and 'Transpose' in types
    save_ark(m, w, meta, tmp_path / 'm.json')
    m2 = read_ark(tmp_path / 'm.json'); w2, meta2 = load_weights(tmp_path / 'm.safetensors')
    assert check_model(m2) == [] and list(meta2['inputs']) == ['x', 'cos', 'sin']
    g = torch.Generator().manual_seed(2)
    xi = [torch.randn(x.shape, generator=g) for x in xs]
    ref = nm.run(*xi)[0].numpy()
    ex = ArkExecutor(m2)
    for tid, a in w2.items(): ex.set(tid, a)
    for n, v in zip(('x', 'cos', 'sin'), xi): ex.set(meta2['inputs'][n], v.numpy())
    ex.run()
    np.testing.assert_allclose(ex.get(meta2['outputs'][0]), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_nac(m2, w2, meta2).run(*xi)[0].numpy(), ref, rtol=1e-5, atol=1e-5)


def test_cat_along_each_dim_and_untiled_windows_refused():
    ("cat of three parts along each axis of a 3-d value matches torch after the round trip; to-nac refuses a gather whose windows "
     "leave a gap.")
    from nac_lab.ark.check import ArkBuilder
    from nac_lab.ark.format import Op
    for dim in range(3):
        class Cat(nn.Module):
            def forward(s, a, b):
                return torch.cat([a * 2.0, b, a], dim)
        a, b = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
        nm = nac_compile(Cat().eval(), (a, b))
        m, w, meta = from_nac(nm.interpreter, {'a': (2, 3, 4), 'b': (2, 3, 4)})
        np.testing.assert_array_equal(to_nac(m, w, meta).run(a, b)[0].numpy(), Cat()(a, b).numpy())
    bld = ArkBuilder(); x = bld.tensor((2, 2)); whole = bld.tensor((2, 5))
    part = bld.tensor((2, 2), strides=(2, 5), offsets=(0, 0), buffer=whole.buffer)
    c = bld.op('Copy', [x], out=part)
    bld.ops.append(Op('Tensor', 'cat', True, [c], [], [bld.like(whole)], {}))
    with pytest.raises(ArkNacError, match='do not tile'): to_nac(bld.model(), {}, {'inputs': {'x': x.id},
                                                                                   'outputs': [bld.ops[-1].result[0].id]})


def test_zoo_gpt2_and_constant_masked_fill():
    ("The zoo's GPT-2 (its causal mask folded to a constant by the NAC compiler) round-trips; masked_fill with a constant mask and a "
     "finite or infinite value matches torch; a mask computed at run time is refused.")
    from nac_lab.nac.compiler.zoo import build_model, example_inputs
    from nac_lab.ark.check import check_model
    mod = build_model('gpt2').eval(); xs = example_inputs('gpt2')
    nm = nac_compile(mod, xs)
    m, w, meta = from_nac(nm.interpreter, {'idx': (tuple(xs[0].shape), xs[0].dtype)})
    assert check_model(m) == [] and all(int(k[1:]) in w for k in meta['params'])
    xi = torch.randint(0, 128, xs[0].shape, generator=torch.Generator().manual_seed(1))
    ref = nm.run(xi)[0].numpy()
    np.testing.assert_allclose(to_nac(m, w, meta).run(xi)[0].numpy(), ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    class Fill(nn.Module):
        def __init__(s, v):
            super().__init__(); s.v = v
            s.register_buffer('mask', torch.rand(3, 5, generator=torch.Generator().manual_seed(0)) > 0.5)
        def forward(s, x): return torch.softmax(x.masked_fill(s.mask, s.v),
                                                -1) if s.v == float('-inf') else x.masked_fill(s.mask, s.v) * 2.0
    for v in (-1e4, 3.5, float('-inf')):
        mod = Fill(v).eval(); x = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
        nm = nac_compile(mod, (torch.zeros(3, 5),))
        m, w, meta = from_nac(nm.interpreter, {'x': (3, 5)})
        with torch.no_grad(): np.testing.assert_allclose(to_nac(m, w, meta).run(x)[0].numpy(), mod(x).numpy(), rtol=1e-6, atol=1e-6)
    class RunTimeMask(nn.Module):
        def forward(s, x, y): return x.masked_fill(y > 0, 0.0)
    nm = nac_compile(RunTimeMask().eval(), (torch.zeros(2, 2), torch.zeros(2, 2)))
    with pytest.raises(ArkNacError, match='has no ARK equivalent|computed at run time'): from_nac(nm.interpreter, {'x': (2, 2),
                                                                                                                   'y': (2, 2)})
