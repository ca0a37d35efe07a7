"""The typed graph (`nac_lab.nac.format.graph`) against the interpreter: for every zoo model and for reference-style files, the
types it infers (by the op kernels on `meta` tensors, symbols traced over three bindings) equal those of the values the
interpreter really computes, through its public API (`NacModel.run_with_values`), at a size none of the bindings used."""
import dataclasses
import numpy as np
import pytest
import torch

from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.nac.format import QuantMethod, read_nac
from nac_lab.nac.format.graph import NacGraph, TensorType, ScalarType, ValueRef, ParamRef, InputRef, ConstRef, NacGraphError
from nac_lab.nac.runtime.run import load
from nac_lab.nac.compiler.zoo import build_model, example_inputs, zoo_names
from test_nac_reference import RefBuilder, Const, rnd

BATCH = 4          # the bindings use 3, 5, 7 (the first primes): 4 checks the traced symbols, not a remembered size


def _types(v) -> tuple:
    "Types of a runtime value, written out here (not the module's helper)."
    if isinstance(v, torch.Tensor): return (TensorType(tuple(v.shape), str(v.dtype).removeprefix('torch.')),)
    if isinstance(v, (tuple, list)): return tuple(t for x in v for t in _types(x))
    return () if v is None else (ScalarType(type(v).__name__),)


def _bound(outputs, env) -> tuple:
    return tuple(TensorType(t.bind(env), t.dtype) if isinstance(t, TensorType) else t for t in outputs)


def _check_against_interpreter(model, g, inputs, env):
    vals = model.run_with_values(*inputs)
    checked = 0
    for n in g:
        if n.kind in ('output', 'intermediate', 'state_out', 'cond'): continue
        assert _bound(n.outputs, env) == _types(vals[n.index]), f'instruction {n.index} {n.name}'
        checked += 1
    return checked


@pytest.mark.parametrize('name', zoo_names())
def test_zoo_types_equal_the_interpreter(name):
    m = nac_compile(build_model(name), example_inputs(name, 2), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    g = NacGraph.from_model(m)
    (sym,) = g.symbols                                   # the batch dim, named by the signature
    assert g.symbols[sym] == (1, None)
    assert g.inputs[0].type.shape[0] == sym              # stays symbolic in the input ...
    out = g.value_type(g.outputs[0].node)
    assert out.shape[0] == sym                           # ... and all the way to the output
    assert all(d is not None for n in g for t in n.outputs if isinstance(t, TensorType) for d in t.shape)
    n = _check_against_interpreter(m, g, example_inputs(name, BATCH), {sym: BATCH})
    assert n >= len(g.ops) > 0


def test_sequence_dim_symbolic_and_derived():
    "GPT-2 with batch and sequence length dynamic: the attention scores are [batch, heads, seq, seq]."
    dyn = ({0: torch.export.Dim('batch', max=16), 1: torch.export.Dim('seq', min=2, max=31)},)
    m = nac_compile(build_model('gpt2'), example_inputs('gpt2', 2), dynamic_shapes=dyn)
    g = NacGraph.from_model(m)
    assert set(g.symbols) == {'batch', 'seq'}
    assert g.inputs[0].type == TensorType(('batch', 'seq'), 'int64')
    assert g.value_type(g.outputs[0].node) == TensorType(('batch', 'seq', 128), 'float32')   # vocab 128
    sdpa = [n for n in g.ops if 'softmax' in n.name or 'scaled_dot' in n.name]
    assert sdpa
    shapes = {t.shape for n in g for t in n.outputs if isinstance(t, TensorType)}
    assert ('batch', 4, 'seq', 16) in shapes                 # q/k/v heads: d 64 / 4 heads = 16
    x = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    _check_against_interpreter(m, g, (x,), {'batch': 2, 'seq': 9})


def test_reference_style_file_with_example(tmp_path):
    "A reference-style file (CMAP ATen names, no signature): canonical names, schema-bound args, shapes from an example."
    b = RefBuilder()
    x = b.input('x')
    cw, cb = rnd(4, 3, 3, 3), rnd(4, seed=2)
    c = b.op('aten.conv2d.default', x, ('P', 'conv.weight', cw), ('P', 'conv.bias', cb), [2, 2], [1, 1], [1, 1], Const(1))
    g_, bb, rm, rv = rnd(4, seed=3), rnd(4, seed=4), rnd(4, seed=6), rnd(4, seed=7).abs() + 0.5
    bn = b.op('aten._native_batch_norm_legit_no_training.default', c, ('P', 'bn.weight', g_), ('P', 'bn.bias', bb),
              ('P', 'bn.running_mean', rm), ('P', 'bn.running_var', rv), 0.1, 1e-5)
    r = b.op('aten.relu.default', bn)
    fl = b.op('aten.flatten.using_ints', r, Const(1), Const(-1))
    parts = b.op('aten.split.Tensor', fl, Const(10), Const(-1))
    second = b.op('getitem', parts, Const(1))
    b.output(second)
    p = b.finish(tmp_path, 'ref')
    xin = rnd(2, 3, 8, 8, seed=11)
    g = NacGraph.from_file(p, example=(xin,))
    conv = g.node(c)
    assert (conv.name, conv.file_name) == ('nac.conv2d', 'aten.conv2d.default')
    assert (conv.attrs['stride'], conv.attrs['padding'], conv.attrs['groups']) == ((2, 2), (1, 1), 1)
    assert isinstance(conv.args['input'], InputRef) and conv.args['weight'] == ParamRef(1, c - 2)
    assert g.value_type(c) == TensorType((2, 4, 4, 4), 'float32')       # (8 + 2 - 3) // 2 + 1 = 4
    assert g.value_type(bn) == TensorType((2, 4, 4, 4), 'float32')      # the tuple-first op yields element 0 (decision NAC 13)
    assert g.value_type(fl) == TensorType((2, 64), 'float32')
    assert g.value_type(parts) == (TensorType((2, 10), 'float32'),) * 6 + (TensorType((2, 4), 'float32'),)   # 64 = 6*10 + 4
    assert g.value_type(second) == TensorType((2, 10), 'float32')
    assert g.outputs == (ValueRef(second),) and g.consumers(parts) == (second,)
    m = load(p)
    _check_against_interpreter(m, g, (xin,), {})
    bare = NacGraph.from_file(p)                                         # no signature, no example: structure, no types
    assert bare.value_type(c) is None and bare.node(c).attrs['stride'] == (2, 2)


@pytest.mark.parametrize('quant', [QuantMethod.INT8_CHANNEL, QuantMethod.INT8_TENSOR, QuantMethod.BLOCK_FP8])
def test_param_table_keeps_the_files_quantization(tmp_path, quant):
    b = RefBuilder()
    x = b.input('x')
    W, bias = rnd(16, 70, seed=30), rnd(16, seed=31)
    b.output(b.op('aten.relu.default', b.op('aten.linear.default', x, ('P', 'fc.weight', W), ('P', 'fc.bias', bias))))
    p = b.finish(tmp_path, 'q', quant=quant, external=True)
    g = NacGraph.from_file(p, example=(rnd(3, 70, seed=1),))
    stored = read_nac(p)
    from nac_lab.nac.format.weights import external_tensors
    t = external_tensors(stored)[1]                                     # what the file holds for fc.weight
    w = g.params[1]
    assert (w.name, w.quant, w.type) == ('fc.weight', quant.name, TensorType((16, 70), 'float32'))
    assert g.params[2].quant == 'NONE' and g.params[2].dtype == 'float32'
    if quant == QuantMethod.INT8_CHANNEL:
        assert (w.dtype, w.shape, w.axis) == ('int8', (16, 70), 0)
        assert np.array_equal(w.scales, t.scales) and w.scales.shape == (16,)
        # scale of row 0 by the definition (absmax / 127), from the float weights, not from the code under test
        assert np.isclose(w.scales[0], np.abs(W[0].numpy()).max() / 127, rtol=1e-6)
    elif quant == QuantMethod.INT8_TENSOR:
        assert w.scale == pytest.approx(float(np.abs(W.numpy()).max() / 127), rel=1e-6) and w.scale == t.scale
    else:
        assert (w.block_size, w.shape, w.scales.shape) == (64, (1152,), (18,))   # 16*70 = 1120 values in 18 blocks of 64
        assert np.array_equal(w.scales, t.scales)
    if w.scales is not None:
        with pytest.raises(ValueError): w.scales[0] = 1.0               # read-only


def test_immutable():
    m = nac_compile(build_model('mlp'), example_inputs('mlp', 2), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    g = NacGraph.from_model(m)
    n = g.ops[0]
    with pytest.raises(dataclasses.FrozenInstanceError): n.name = 'x'
    with pytest.raises(dataclasses.FrozenInstanceError): g.nodes = ()
    with pytest.raises(TypeError): n.args['input'] = ConstRef(1)
    with pytest.raises(TypeError): g.params[0] = None
    with pytest.raises(AttributeError): g.nodes.append(n)
    assert NacGraph.from_model(m) is g
    m.nac = read_nac(m.to_bytes())                                     # a replaced NacFile: a new graph
    assert NacGraph.from_model(m) is not g


def test_unknown_node_is_a_typed_error():
    m = nac_compile(build_model('mlp'), example_inputs('mlp', 2))
    g = NacGraph.from_model(m)
    with pytest.raises(NacGraphError, match=r'instruction 99 is not a node'): g.consumers(99)


def test_cli_inspect_and_graph_shapes(tmp_path, capsys):
    "`nac-lab inspect --shapes` lists each instruction's result type; `nac-lab graph --shapes` labels the edges with them."
    import json
    from nac_lab.cli import main
    m = nac_compile(build_model('mlp'), example_inputs('mlp', 2), dynamic_shapes=({0: torch.export.Dim.AUTO},))
    p = m.save(tmp_path / 'mlp.nac')
    assert main(['inspect', str(p), '--shapes']) == 0
    out = capsys.readouterr().out.splitlines()
    assert '   0  input x -> float32[x_dim0, 32]' in out
    assert '   1  param fc1.weight -> float32[64, 32]' in out
    assert '  11  nac.linear -> float32[x_dim0, 10]' in out                 # fc3: 64 -> 10
    assert '   8  nac.gelu -> float32[x_dim0, 64]' in out                   # approximate='none' is the default: not shown
    assert main(['inspect', str(p), '--shapes', '--json']) == 0
    s = json.loads(capsys.readouterr().out)
    assert s['shapes']['3'] == 'float32[x_dim0, 64]' and '12' not in s['shapes']     # 12: the <OUTPUT>, no value
    assert main(['graph', str(p), '--shapes', '-o', str(tmp_path / 'g.svg')]) == 0
    svg = (tmp_path / 'g.svg').read_text()
    assert 'float32[x_dim0, 64]' in svg


def test_int8_lowering_keeps_the_files_int8_channel_weights():
    "A .nac storing its weights INT8_CHANNEL: lowering quantizes with the file's int8 values and scales, not re-derived ones."
    from nac_lab.nac.runtime.run import NacModel
    from nac_lab.nac.format.weights import load_weights, set_weights
    from nac_lab.lower.graph import import_nac
    from nac_lab.lower.quant import calibrate, quantize_graph
    m = nac_compile(build_model('mlp'), example_inputs('mlp', 2))
    from nac_lab.nac.format import write_nac
    qn = read_nac(m.to_bytes())
    set_weights(qn, load_weights(qn), QuantMethod.INT8_CHANNEL)
    t0 = qn.tensors[0]                                   # fc1.weight: row 0 halved, so its largest |q| is 63, not 127 -
    t0.data = t0.data.copy(); t0.data[0] //= 2           # re-quantizing the dequantized floats would give other int8 values
    nac = read_nac(write_nac(qn))                        # the file as stored, read back
    q = NacModel(nac)
    x = example_inputs('mlp', 2)[0].numpy()
    g = import_nac(q, x)
    _, ql = quantize_graph(g, calibrate(q, g, [(x,)]))
    lin = [l for l in g.layers if l.op == 'linear']
    assert len(lin) == 3
    ids = {n: k for k, n in nac.param_names.items()}
    for l, wname in zip(lin, ('fc1.weight', 'fc2.weight', 'fc3.weight')):
        t = nac.tensors[ids[wname]]
        assert np.array_equal(ql[l.name].wq, t.data) and np.array_equal(ql[l.name].sw, t.scales.astype(np.float64))
    assert np.abs(ql[lin[0].name].wq[0].astype(int)).max() <= 64                   # the file's halved row, kept as stored
    # a float file: the lowering derives the scales itself (absmax / 127 per output channel)
    gf = import_nac(m, x)
    _, qf = quantize_graph(gf, calibrate(m, gf, [(x,)]))
    w0 = load_weights(m.nac)['fc1.weight'].astype(np.float64)
    assert gf.layers[0].stored_q is None
    assert np.allclose(qf[gf.layers[0].name].sw, np.abs(w0).max(axis=1) / 127)
