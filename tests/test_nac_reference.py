"""Reference-style NAC v1.6 files (decision NAC 6, 8, 13-15), built here with nac_lab's writer the way the reference
compiler lays them out, and run against torch eager.

The reference habits reproduced: CMAP names every op by its full ATen overload (`aten.linear.default`) at ids
from 20 up (overriding the predefined table), Python's `operator.getitem` is CMAP `getitem`, the optimizer's
deleted `getitem(x, 0)` after `_native_batch_norm_legit_no_training` / `native_layer_norm` (the consumer reads
the tuple op directly), parameter loads just before their first reader, external quantized weights with the
`{"quant_type": ...}` metadata, and the lost-constant placeholder string in CNST. Expected values are computed
with torch.nn.functional directly, not with the code under test.
"""
import json
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from nac_lab.nac.format import NacFile, Instruction, DataTensor, DType, QuantMethod, read_nac
from nac_lab.nac.format.weights import safetensors_bytes, read_safetensors, quantize
from nac_lab.nac.compiler.compile import load
from nac_lab.nac.runtime.run import NacRunError


class RefBuilder:
    "Writes a program the way the reference compiler does: full ATen names in CMAP from id 20, JIT parameter loads."
    def __init__(self):
        self.nac = NacFile()
        self.ids = {}
        self.weights = {}

    def op_id(self, name):
        if name not in self.ids:
            self.ids[name] = 20 + len(self.ids); self.nac.cmap[self.ids[name]] = name
        return self.ids[name]

    def input(self, name):
        i = len(self.nac.ops); self.nac.ops.append(Instruction.user_input()); self.nac.input_names[i] = name
        self.nac.n_inputs += 1
        return i

    def param(self, name, value):
        pid = len(self.nac.param_names) + 1
        self.nac.param_names[pid] = name; self.weights[name] = value
        self.nac.ops.append(Instruction.param(pid))
        return len(self.nac.ops) - 1

    def op(self, name, *args):
        "args: int = reference to an instruction, ('P', name, tensor) = a parameter loaded just before, else a constant."
        resolved = []
        for a in args:
            if isinstance(a, tuple) and a and a[0] == 'P': resolved.append(('ref', self.param(a[1], a[2])))
            else: resolved.append(a)
        sig, out = '', []
        for a in resolved:
            if isinstance(a, tuple) and a[0] == 'ref': sig += 'T'; out.append(a)
            elif isinstance(a, int) and not isinstance(a, bool) and a >= 0 and a < len(self.nac.ops) and not isinstance(a, Const):
                sig += 'T'; out.append(('ref', a))
            else: sig += 'c'; out.append(('const', a.v if isinstance(a, Const) else a))
        return self.nac.add_op(self.op_id(name), sig, out)

    def output(self, *refs):
        j = len(self.nac.ops); self.nac.ops.append(Instruction.output([r - j for r in refs])); self.nac.n_outputs = len(refs)

    def finish(self, tmp_path, name, quant=None, external=False):
        nac = self.nac
        method = quant or QuantMethod.NONE
        for pid, pname in nac.param_names.items():
            x = self.weights[pname]
            nac.tensors[pid] = quantize(pid, x.numpy(), method if x.dim() >= 2 else QuantMethod.NONE)
        nac.quant_method, nac.weights_internal = method, not external
        p = tmp_path / f'{name}.nac'
        nac.save(p)
        return p


class Const:
    "A constant argument that would otherwise look like an instruction reference."
    def __init__(self, v): self.v = v


def rnd(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g)


def test_linear_relu_and_getitem(tmp_path):
    "aten.* CMAP names at ids 20+ override the predefined table; `getitem` picks a tuple element (split)."
    b = RefBuilder()
    x = b.input('x')
    W, bias = rnd(8, 6), rnd(8, seed=1)
    h = b.op('aten.linear.default', x, ('P', 'fc.weight', W), ('P', 'fc.bias', bias))
    r = b.op('aten.relu.default', h)
    parts = b.op('aten.split.Tensor', r, Const(4), Const(-1))
    second = b.op('getitem', parts, Const(1))
    y = b.op('aten.mul.Tensor', second, Const(2.0))
    b.output(y)
    p = b.finish(tmp_path, 'lin')
    assert read_nac(p).cmap[20] == 'aten.linear.default'
    xin = rnd(3, 6, seed=5)
    got = load(p).run(xin)[0]
    ref = F.relu(F.linear(xin, W, bias)).split(4, -1)[1] * 2.0
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


def test_deleted_getitem_after_batch_norm_and_layer_norm(tmp_path):
    "The consumer of _native_batch_norm_legit_no_training / native_layer_norm reads element 0 (decision NAC 13)."
    b = RefBuilder()
    x = b.input('x')
    cw, cb = rnd(4, 3, 3, 3), rnd(4, seed=2)
    c = b.op('aten.conv2d.default', x, ('P', 'conv.weight', cw), ('P', 'conv.bias', cb), [1, 1], [1, 1], [1, 1], Const(1))
    g, bb, rm, rv = rnd(4, seed=3), rnd(4, seed=4), rnd(4, seed=6), rnd(4, seed=7).abs() + 0.5
    bn = b.op('aten._native_batch_norm_legit_no_training.default', c, ('P', 'bn.weight', g), ('P', 'bn.bias', bb),
              ('P', 'bn.running_mean', rm), ('P', 'bn.running_var', rv), 0.1, 1e-5)
    r = b.op('aten.relu.default', bn)                                 # reads the tuple op directly
    fl = b.op('aten.flatten.using_ints', r, Const(1), Const(-1))
    lw, lb = rnd(64, seed=8), rnd(64, seed=9)
    ln = b.op('aten.native_layer_norm.default', fl, [64], ('P', 'ln.weight', lw), ('P', 'ln.bias', lb), 1e-5)
    t = b.op('aten.tanh.default', ln)                                 # again without getitem
    b.output(t)
    p = b.finish(tmp_path, 'bn')
    xin = rnd(2, 3, 4, 4, seed=11)
    got = load(p).run(xin)[0]
    ref = F.conv2d(xin, cw, cb, 1, 1)
    ref = F.batch_norm(ref, rm, rv, g, bb, False, 0.1, 1e-5).relu().flatten(1)
    ref = torch.tanh(F.layer_norm(ref, [64], lw, lb, 1e-5))
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


def test_layer_norm_and_sdpa_single_results(tmp_path):
    "layer_norm and scaled_dot_product_attention already return one tensor: their consumers read it as it is."
    b = RefBuilder()
    q, k, v = b.input('q'), b.input('k'), b.input('v')
    a = b.op('aten.scaled_dot_product_attention.default', q, k, v)
    w, bias = rnd(8, seed=12), rnd(8, seed=13)
    n = b.op('aten.layer_norm.default', a, [8], ('P', 'ln.weight', w), ('P', 'ln.bias', bias), 1e-5)
    out = b.op('aten.gelu.default', n, 'none')
    b.output(out)
    p = b.finish(tmp_path, 'attn')
    qs = [rnd(1, 2, 5, 8, seed=s) for s in (20, 21, 22)]
    got = load(p).run(*qs)[0]
    ref = F.gelu(F.layer_norm(F.scaled_dot_product_attention(*qs), [8], w, bias, 1e-5))
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


def test_getitem_and_direct_reads_of_one_tuple_are_refused(tmp_path):
    b = RefBuilder()
    x = b.input('x')
    ln = b.op('aten.native_layer_norm.default', x, [4], None, None, 1e-5)
    a = b.op('getitem', ln, Const(1))
    r = b.op('aten.relu.default', ln)
    b.output(a, r)
    p = b.finish(tmp_path, 'mixed')
    with pytest.raises(NacRunError, match=r'instruction 1 \(aten.native_layer_norm.default\): its tuple result is read through getitem'):
        load(p).interpreter


@pytest.mark.parametrize('quant', [QuantMethod.INT8_TENSOR, QuantMethod.INT8_CHANNEL, QuantMethod.BLOCK_FP8])
def test_external_quantized_weights_with_reference_metadata(tmp_path, quant):
    "The reference's `{'quant_type': ...}` metadata is read and written; values are dequantized (decision NAC 8, 15)."
    b = RefBuilder()
    x = b.input('x')
    W, bias = rnd(16, 12, seed=30), rnd(16, seed=31)
    h = b.op('aten.linear.default', x, ('P', 'fc.weight', W), ('P', 'fc.bias', bias))
    b.output(b.op('aten.relu.default', h))
    p = b.finish(tmp_path, 'q', quant=quant, external=True)
    st, meta = read_safetensors(p.with_suffix('.safetensors'))
    m = json.loads(meta['fc.weight'])
    assert m['quant_type'] == quant.name and 'quant' not in m
    if quant == QuantMethod.INT8_CHANNEL: assert m['axis'] == 0 and len(m['scales']) == 16
    # the file as the reference itself writes it: hand-made metadata JSON in the reference's key order
    qt = quantize(1, W.numpy(), quant)
    if quant == QuantMethod.INT8_TENSOR: ref_meta = {'quant_type': 'INT8_TENSOR', 'scale': float(qt.scale)}
    elif quant == QuantMethod.INT8_CHANNEL: ref_meta = {'quant_type': 'INT8_CHANNEL', 'scales': [float(s) for s in qt.scales], 'axis': 0}
    else: ref_meta = {'quant_type': 'BLOCK_FP8', 'block_size': 64, 'orig_shape': [16, 12], 'scales': [float(s) for s in qt.scales]}
    bias_t = DataTensor(2, DType.F32, bias.numpy())
    p.with_suffix('.safetensors').write_bytes(safetensors_bytes({'fc.weight': qt, 'fc.bias': bias_t}, {'fc.weight': json.dumps(ref_meta)}))
    xin = rnd(4, 12, seed=32)
    got = load(p).run(xin)[0]
    # expected: dequantize by the rules of decision NAC 8, computed here with numpy
    q = qt.data.astype(np.float32)
    if quant == QuantMethod.INT8_TENSOR: Wd = q * np.float32(qt.scale)
    elif quant == QuantMethod.INT8_CHANNEL: Wd = q * np.asarray(qt.scales, np.float32)[:, None]
    else: Wd = (q.reshape(-1, 64) * np.asarray(qt.scales, np.float32)[:, None]).reshape(-1)[:16 * 12].reshape(16, 12)
    ref = F.relu(F.linear(xin, torch.from_numpy(Wd), bias))
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    assert (Wd - W.numpy()).std() < 0.05                                  # and it is close to the float weights


def test_older_nac_lab_metadata_still_reads(tmp_path):
    b = RefBuilder()
    x = b.input('x')
    W = rnd(5, 3, seed=40)
    b.output(b.op('aten.linear.default', x, ('P', 'w', W), None))
    p = b.finish(tmp_path, 'old', quant=QuantMethod.INT8_TENSOR, external=True)
    qt = quantize(1, W.numpy(), QuantMethod.INT8_TENSOR)
    p.with_suffix('.safetensors').write_bytes(safetensors_bytes({'w': qt}, {'w': json.dumps({'quant': 2, 'scale': float(qt.scale)})}))
    xin = rnd(2, 3, seed=41)
    ref = F.linear(xin, torch.from_numpy(qt.data.astype(np.float32) * np.float32(qt.scale)))
    torch.testing.assert_close(load(p).run(xin)[0], ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize('placeholder', ['Tensor_torch.Size([4])_torch.float32', 'Tensor_torch.Size([2, 3])_torch.int64',
                                         'Tensor_torch.Size([])_torch.bfloat16'])
def test_lost_constant_is_refused_at_load(tmp_path, placeholder):
    b = RefBuilder()
    x = b.input('x')
    y = b.op('aten.add.Tensor', x, placeholder)
    b.output(b.op('aten.clone.default', y))
    p = b.finish(tmp_path, 'lost')
    cid = next(k for k, v in read_nac(p).constants.items() if v == placeholder)
    with pytest.raises(NacRunError) as ei: load(p).interpreter
    msg = str(ei.value)
    assert msg.startswith('instruction 1 (aten.add.Tensor): argument 1 is CNST constant')
    assert f'constant {cid} = {placeholder!r}' in msg and 'value is not in the file' in msg


def test_ordinary_strings_are_not_placeholders(tmp_path):
    b = RefBuilder()
    x = b.input('x')
    b.output(b.op('aten.gelu.default', x, 'tanh'))
    p = b.finish(tmp_path, 'gelu')
    xin = rnd(3, 4, seed=50)
    torch.testing.assert_close(load(p).run(xin)[0], F.gelu(xin, approximate='tanh'), rtol=0, atol=1e-6)
