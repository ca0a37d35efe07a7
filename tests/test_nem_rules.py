"""NEM static rules: table-driven valid and invalid programs (notebook 34).

Each invalid case marks the line where a diagnostic is expected with a trailing comment
`#! RULE word1|word2` (`#!w RULE` for a warning, `#!i RULE` for an info). The test asserts that a
diagnostic of that severity and rule is reported on that line and that its message (with notes) contains
every listed word, and that no other error is reported. Valid cases must produce no error.
Expected lines and words come from the marker comments, written by hand, not from the checker.
"""
import re
import pytest
from nac_lab.core import data_path
from nac_lab.nem.analysis.check import check

LITE = 'include "devices/npm_lite.nem"\ndevice npm_lite\n'
PRO = 'include "devices/npm_pro.nem"\ndevice npm_pro\n'
BUFS = '''buffer A : L1 (size=4096, align=64)
buffer B : L1 (size=4096, align=64)
buffer G : L2 (size=65536, align=64)
'''
X16 = 'X = region(A, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nY = region(B, 0, 128, elem=f16, shape=[1, 64], layout=NC)\n'

MARK = re.compile(r'#!([wi]?)\s+(\S+)\s*(.*)$')

def expectations(src):
    out = []
    for n, line in enumerate(src.split('\n'), 1):
        m = MARK.search(line)
        if m:
            sev = {'': 'error', 'w': 'warning', 'i': 'info'}[m.group(1)]
            words = [w for w in m.group(3).split('|') if w.strip()]
            out.append((sev, m.group(2), n, [w.strip() for w in words]))
    return out

def run_case(src, device=None):
    r = check(text=src, name='case.nem', base_dir=data_path('nem'), device=device)
    exp = expectations(src)
    for sev, rule, line, words in exp:
        cands = [d for d in r.diags if d.severity == sev and d.rule == rule and d.line == line]
        assert cands, f'expected {sev} {rule} on line {line}; got:\n{r.format()}'
        text = ' '.join(cands[0].message.split()) + ' ' + ' '.join(cands[0].notes)
        assert any(all(w in (' '.join(c.message.split()) + ' ' + ' '.join(c.notes)) for w in words) for c in cands), \
            f'{rule} on line {line} lacks {words}: {text}'
    expected_err = {(rule, line) for sev, rule, line, _ in exp if sev == 'error'}
    extra = [d for d in r.errors if (d.rule, d.line) not in expected_err]
    assert not extra, 'unexpected errors:\n' + '\n'.join(d.format() for d in extra)
    return r

CASES = {
# ---------------- constants (const rules 1-7) ----------------
'const_ok': 'const A = 4\nconst B = A * 2 + 1\nconst C = (B - A) / 2 mod 3\n',
'const_duplicate': 'const N = 4\nconst N = 5  #! const.duplicate N|declared twice\n',
'const_duplicate_in_expr_chain': 'const a = 1\nconst b = a + 1\nconst a = b  #! const.duplicate a|twice\n',
'const_float': 'const E = 1.5  #! const.integer FLOAT|1.5\n',
'const_float_nested': 'const K = 2 * (3 + 0.25)  #! const.integer 0.25\n',
'const_forward': 'const A = B + 1  #! const.forward-ref B|declared later\nconst B = 2\n',
'const_undeclared': 'const A = Q * 2  #! const.forward-ref Q|not declared\n',
'const_nonconst_buffer': 'buffer Z : L2 (size=64)\nconst A = Z + 1  #! const.non-const Z|buffer\n',
'const_nonconst_loopvar': 'loop i in [0..1]:\n  wait(t)  #! token.undefined t\nendloop\nconst A = i  #! const.non-const i|loop variable\n',
'const_div_zero': 'const Z = 0\nconst A = 10 / Z  #! const.div-zero division by zero\n',
'const_mod_zero': 'const A = 10 mod (2 - 2)  #! const.div-zero mod by zero\n',
'const_in_loop': 'loop i in [0..3]:\n    const K = 2  #! const.in-loop inside a loop\nendloop\n',
'const_in_nested_loop': 'loop i in [0..1]:\n  loop j in [0..1]:\n    const K = 2  #! const.in-loop K\n  endloop\nendloop\n',
'const_conflict_buffer': 'const A = 64  #! const.name-conflict A|buffer\nbuffer A : L2 (size=64)\n',
'const_conflict_token': LITE + BUFS + X16 + 'const t1 = 3  #! const.name-conflict t1|token\nt1 = relu.async in X out Y\n',
'const_truncation_ok': 'const A = -7 / 2\nconst B = -7 mod 2\nbuffer Z : L2 (size=A + 10 + B * 0)\n',
# ---------------- names and expressions ----------------
'expr_undefined_size': 'buffer Z : L2 (size=N * 2)  #! expr.undefined N\n',
'expr_undefined_offset': 'buffer Z : L2 (size=64)\nR = region(Z, off, 8)  #! expr.undefined off\n',
'expr_div_zero_region': 'buffer Z : L2 (size=64)\nR = region(Z, 8 / 0, 8)  #! expr.div-zero division by zero\n',
'expr_float_size': 'buffer Z : L2 (size=64.0)  #! expr.float 64.0\n',
'name_duplicate_buffer': 'buffer Z : L2 (size=64)\nbuffer Z : L2 (size=32)  #! name.duplicate Z|twice\n',
'name_duplicate_region_buffer': 'buffer Z : L2 (size=64)\nZ = region(Z, 0, 8)  #! name.duplicate Z|buffer\n',
'loop_empty': 'loop i in [3..1]:  #!w loop.bounds zero times\n  wait(x)\nendloop\n',
# ---------------- buffers and capacity ----------------
'buffer_ok': LITE + 'buffer A : L1[0] (size=1024, align=128)\nbuffer B : L2 (size=2048)\nbuffer C : DDR (size=1 << 0)\n'.replace('1 << 0',
                                                                                                                                 '1'),
'buffer_size_zero': 'buffer Z : L2 (size=0)  #! buffer.size positive\n',
'buffer_size_negative': 'const S = 4\nbuffer Z : L2 (size=S - 10)  #! buffer.size -6\n',
'buffer_align_not_pow2': 'buffer Z : L2 (size=64, align=48)  #! buffer.align power of two|48\n',
'buffer_align_zero': 'buffer Z : L2 (size=64, align=0)  #! buffer.align power of two\n',
'buffer_l1_index_device': LITE + 'buffer Z : L1[1] (size=64)  #! buffer.level L1[1]|1 engine\n',
'buffer_l1_index_negative': 'buffer Z : L1[-1] (size=64)  #! buffer.level L1[-1]\n',
'buffer_l1_index_ok_multi': PRO + 'buffer Z : L1[3] (size=64)\n',
'capacity_l1': LITE + 'buffer P : L1 (size=400000)\nbuffer Q : L1 (size=200000)  #! memory.capacity L1[0]|600000|524288\n',
'capacity_l2': LITE + 'buffer P : L2 (size=1048577)  #! memory.capacity L2|1048577|1048576\n',
'capacity_ddr_unbounded': LITE + 'buffer P : DDR (size=100000000)\n',
'capacity_per_engine_ok': PRO + 'buffer P : L1[0] (size=1048576)\nbuffer Q : L1[1] (size=1048576)\n',
# ---------------- regions ----------------
'region_ok_i4': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 3, elem=i4, shape=[5], layout=C)\n',
'region_unknown_buffer': 'R = region(Nope, 0, 8)  #! region.buffer Nope|not a declared buffer\n',
'region_buffer_is_const': 'const K = 3\nR = region(K, 0, 8)  #! region.buffer K|constant\n',
'region_oob': 'buffer Z : L2 (size=64)\nR = region(Z, 32, 64)  #! region.bounds [32, 96)|64 bytes\n',
'region_oob_loop': 'buffer Z : L2 (size=64)\nloop i in [0..4]:\n  let R = region(Z, i * 16, 16)  #! region.bounds i=4|[64, 80)\nendloop\n',
'region_negative_offset': 'buffer Z : L2 (size=64)\nR = region(Z, 0 - 8, 8)  #! region.bounds -8\n',
'region_zero_extent': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 0)  #! region.bounds extent 0\n',
'region_incomplete_types': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 8, elem=i8, shape=[8])  #! region.types layout or strides\n',
'region_missing_elem': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 8, shape=[8], layout=C)  #! region.types elem\n',
'region_extent_small': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 8, elem=f16, shape=[8], layout=C)  #! region.extent 16 bytes|8 f16\n',
'region_extent_i4': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 2, elem=i4, shape=[5], layout=C)  #! region.extent 3 bytes|ceil\n',
'region_layout_rank': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 16, elem=i8, shape=[4, 4], layout=NHWC)  #! region.layout NHWC|rank 2\n',
'region_strides_rank': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 16, elem=i8, shape=[4, 4], strides=[4])  #! region.layout 1 '
                       'strides|rank 2\n',
'region_strides_beyond': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 16, elem=i8, shape=[4, 4], strides=[8, 1])  #! region.extent '
                         'strides|beyond\n',
'region_strides_ok': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 32, elem=i8, shape=[4, 4], strides=[8, 1])\n',
'region_zero_dim': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 16, elem=i8, shape=[4, 0], layout=HW)  #! region.types positive\n',
'quant_per_channel_len': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 16, elem=i8, shape=[4, 4], layout=HW,\n  quant=per_channel(axis=1, '
                         'scales=[1.0, 1.0, 1.0], zero_points=[0, 0, 0, 0]))  #! region.quant scales|3 entries|dim[1] = 4\n',
'quant_per_group_len': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 64, elem=i4, shape=[2, 64], layout=RC,\n  quant=per_group(axis=1, '
                       'group_size=32, scales=[1.0], zero_points=[0, 0]))  #! region.quant ceil(64 / 32) = 2|1 entries\n',
'quant_group_uneven_ok': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 40, elem=i4, shape=[1, 70], layout=RC,\n  quant=per_group(axis=1, '
                         'group_size=32, scales=[1.0, 1.0, 1.0], zero_points=[0, 0, 0]))\n',
'quant_axis_range': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 16, elem=i8, shape=[16], layout=C, quant=per_channel(axis=2, scales=[1.0], '
                    'zero_points=[0]))  #! region.quant axis 2\n',
'quant_group_zero': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 16, elem=i8, shape=[16], layout=C, quant=per_group(axis=0, group_size=0, '
                    'scales=[1.0], zero_points=[0]))  #! region.quant group_size\n',
'quant_on_float_warns': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 32, elem=f16, shape=[16], layout=C, quant=per_tensor(scale=1.0, '
                        'zero_point=0))  #!w region.quant not an integer\n',
# ---------------- transfers ----------------
'transfer_ok_buffer_names': 'buffer P : L2 (size=64)\nbuffer Q : L1 (size=64)\nt = transfer.async(dst=Q, src=P)\nwait(t)\n',
'transfer_extent': 'buffer P : L2 (size=64)\nbuffer Q : L1 (size=32)\nt = transfer.async(dst=Q, src=P)  #! transfer.extent 64 '
                   'bytes|only 32\n',
'transfer_types': 'buffer P : L2 (size=64)\nbuffer Q : L1 (size=64)\nt = transfer.async(dst=region(Q, 0, 64, elem=f16, shape=[32], '
                  'layout=C), src=region(P, 0, 64, elem=bf16, shape=[32], layout=C))  #! transfer.types bf16|f16|cast\n',
'transfer_types_count': 'buffer P : L2 (size=64)\nbuffer Q : L1 (size=64)\nt = store.async(dst=region(Q, 0, 64, elem=i8, shape=[32], '
                        'layout=C), src=region(P, 0, 64, elem=i8, shape=[64], layout=C))  #! transfer.types element counts\n',
'transfer_operand_const': 'const K = 4\nbuffer Q : L1 (size=64)\nt = transfer.async(dst=Q, src=K)  #! transfer.operand K|constant\n',
'transfer_operand_unknown': 'buffer Q : L1 (size=64)\nt = transfer.async(dst=Q, src=Nowhere)  #! expr.undefined Nowhere\n',
# ---------------- compute structure and shapes ----------------
'relu_ok': LITE + BUFS + X16 + 't = relu.async in X out Y\n',
'operands_too_many': LITE + BUFS + X16 + 't = relu.async in X, X out Y  #! compute.operands 1 input|got 2\n',
'operands_missing_input': LITE + BUFS + X16 + 't = add.async in X out Y  #! compute.operands 2 input|got 1\n',
'operand_is_buffer': LITE + BUFS + X16 + 't = relu.async in A out Y  #! compute.operands A|buffer\n',
'untyped_operand': LITE + BUFS + 'R = region(A, 0, 128)\nY = region(B, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nt = relu.async in R '
                                 'out Y  #! compute.untyped R|typed\n',
'untyped_inline': LITE + BUFS + X16 + 't = relu.async in region(A, 0, 64) out Y  #! compute.untyped typed\n',
'attr_missing': LITE + BUFS + X16 + 't = leaky_relu.async in X out Y  #! compute.attrs alpha\n',
'attr_missing_accum': LITE + BUFS + 'P = region(A, 0, 32, elem=f16, shape=[4, 4], layout=MK)\nQ = region(B, 0, 32, elem=f16, shape=[4, '
                                    '4], layout=KN)\nR = region(A, 64, 32, elem=f16, shape=[4, 4], layout=MN)\nt = gemm.async in P, Q out '
                                    'R  #! compute.attrs accum_type\n',
'attr_unknown_warns': LITE + BUFS + X16 + 't = relu.async in X out Y slope=2  #!w compute.attrs slope\n',
'attr_value_accum': LITE + BUFS + X16.replace('f16', 'f16') + 'P = region(A, 0, 32, elem=f16, shape=[4, 4], layout=MK)\nQ = region(B, 0, '
                                              '32, elem=f16, shape=[4, 4], layout=KN)\nR = region(A, 64, 32, elem=f16, shape=[4, 4], '
                                              'layout=MN)\nt = gemm.async in P, Q out R accum_type=float  #! compute.attr-value '
                                              'accum_type\n',
'eltwise_shape': LITE + BUFS + 'X = region(A, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nY = region(B, 0, 64, elem=f16, shape=[1, 32], '
                               'layout=NC)\nt = relu.async in X out Y  #! compute.shape [1, 32]|identical\n',
'binary_shape': LITE + BUFS + 'X = region(A, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nZ = region(A, 128, 128, elem=f16, shape=[64, '
                              '1], layout=NC)\nY = region(B, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nt = add.async in X, Z out Y  #! '
                              'compute.shape [64, 1]\n',
'gemm_ok': LITE + BUFS + 'P = region(A, 0, 48, elem=f16, shape=[2, 12], layout=MK)\nQ = region(B, 0, 96, elem=f16, shape=[12, 4], '
                         'layout=KN)\nR = region(A, 64, 16, elem=f16, shape=[2, 4], layout=MN)\nt = gemm.async in P, Q out R '
                         'accum_type=f32\n',
'gemm_inner': LITE + BUFS + 'P = region(A, 0, 48, elem=f16, shape=[2, 12], layout=MK)\nQ = region(B, 0, 96, elem=f16, shape=[8, 6], '
                            'layout=KN)\nR = region(A, 64, 24, elem=f16, shape=[2, 6], layout=MN)\nt = gemm.async in P, Q out R '
                            'accum_type=f32  #! compute.shape inner dimensions|K=12|K=8\n',
'gemm_out': LITE + BUFS + 'P = region(A, 0, 48, elem=f16, shape=[2, 12], layout=MK)\nQ = region(B, 0, 96, elem=f16, shape=[12, 4], '
                          'layout=KN)\nR = region(A, 64, 16, elem=f16, shape=[4, 2], layout=MN)\nt = gemm.async in P, Q out R '
                          'accum_type=f32  #! compute.shape [4, 2]|[2, 4]\n',
'matmul_batched_ok': LITE + BUFS + 'P = region(A, 0, 96, elem=f16, shape=[2, 2, 12], layout=BMK)\nQ = region(B, 0, 192, elem=f16, '
                                   'shape=[2, 12, 4], layout=BKN)\nR = region(A, 128, 32, elem=f16, shape=[2, 2, 4], layout=BMN)\nt = '
                                   'matmul.async in P, Q out R accum_type=f32\n',
'conv_ok': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 2048, elem=f16, shape=[1, 8, 8, 16], layout=NHWC)\nW = region(A, 2048, '
                  '9216, elem=f16, shape=[3, 3, 16, 32], layout=HWIO)\nY = region(A, 12288, 2304, elem=f16, shape=[1, 6, 6, 32], '
                  'layout=NHWC)\nt = conv2d.async in X, W out Y pads=[0, 0, 0, 0] strides=[1, 1] dilations=[1, 1] accum_type=f32\n',
'conv_out_shape': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 2048, elem=f16, shape=[1, 8, 8, 16], layout=NHWC)\nW = region(A, '
                         '2048, 9216, elem=f16, shape=[3, 3, 16, 32], layout=HWIO)\nY = region(A, 12288, 2304, elem=f16, shape=[1, 6, 6, '
                         '32], layout=NHWC)\nt = conv2d.async in X, W out Y pads=[1, 1, 1, 1] strides=[1, 1] dilations=[1, 1] '
                         'accum_type=f32  #! compute.shape [1, 8, 8, 32]|floor\n',
'conv_stride_shape': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 2048, elem=f16, shape=[1, 8, 8, 16], layout=NHWC)\nW = '
                            'region(A, 2048, 9216, elem=f16, shape=[3, 3, 16, 32], layout=HWIO)\nY = region(A, 12288, 2304, elem=f16, '
                            'shape=[1, 6, 6, 32], layout=NHWC)\nt = conv2d.async in X, W out Y pads=[1, 1, 1, 1] strides=[2, 2] '
                            'dilations=[1, 1] accum_type=f32  #! compute.shape [1, 4, 4, 32]\n',
'conv_channels': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 2048, elem=f16, shape=[1, 8, 8, 16], layout=NHWC)\nW = region(A, '
                        '2048, 4608, elem=f16, shape=[3, 3, 8, 32], layout=HWIO)\nY = region(A, 12288, 2304, elem=f16, shape=[1, 6, 6, '
                        '32], layout=NHWC)\nt = conv2d.async in X, W out Y pads=[0, 0, 0, 0] strides=[1, 1] dilations=[1, 1] '
                        'accum_type=f32  #! compute.shape input channels 16\n',
'conv_pads_len': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 2048, elem=f16, shape=[1, 8, 8, 16], layout=NHWC)\nW = region(A, '
                        '2048, 9216, elem=f16, shape=[3, 3, 16, 32], layout=HWIO)\nY = region(A, 12288, 2304, elem=f16, shape=[1, 6, 6, '
                        '32], layout=NHWC)\nt = conv2d.async in X, W out Y pads=[0, 0] strides=[1, 1] dilations=[1, 1] accum_type=f32  #! '
                        'compute.attr-value pads|2 entries|needs 4\n',
'pool_ok': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 2048, elem=f16, shape=[1, 8, 8, 16], layout=NHWC)\nY = region(A, 4096, '
                  '512, elem=f16, shape=[1, 4, 4, 16], layout=NHWC)\nt = maxpool.async in X out Y kernel_shape=[2, 2] pads=[0, 0, 0, 0] '
                  'strides=[2, 2]  #!w type.no-family maxpool\n',
'pool_shape': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 2048, elem=f16, shape=[1, 8, 8, 16], layout=NHWC)\nY = region(A, 4096, '
                     '512, elem=f16, shape=[1, 4, 4, 16], layout=NHWC)\nt = avgpool.async in X out Y kernel_shape=[2, 2] pads=[0, 0, 0, '
                     '0] strides=[1, 1]  #! compute.shape [1, 7, 7, 16]\n',
'transpose_perm': LITE + BUFS + 'X = region(A, 0, 48, elem=f16, shape=[2, 3, 4], layout=ABC)\nY = region(B, 0, 48, elem=f16, shape=[4, 2, '
                                '3], layout=ABC)\nt = transpose.async in X out Y perm=[2, 0, 0]  #! compute.attr-value permutation\n',
'transpose_shape': LITE + BUFS + 'X = region(A, 0, 48, elem=f16, shape=[2, 3, 4], layout=ABC)\nY = region(B, 0, 48, elem=f16, shape=[4, '
                                 '3, 2], layout=ABC)\nt = transpose.async in X out Y perm=[2, 0, 1]  #! compute.shape [4, 2, 3]\n',
'reshape_count': LITE + BUFS + 'X = region(A, 0, 48, elem=f16, shape=[2, 12], layout=AB)\nY = region(B, 0, 50, elem=f16, shape=[5, 5], '
                               'layout=AB)\nt = reshape.async in X out Y target_shape=[5, 5]  #! compute.shape element count|25|24\n',
'reshape_ok': LITE + BUFS + 'X = region(A, 0, 48, elem=f16, shape=[2, 12], layout=AB)\nY = region(B, 0, 48, elem=f16, shape=[4, 6], '
                            'layout=AB)\nt = reshape.async in X out Y target_shape=[4, 6]\n',
'concat_ok': LITE + BUFS + 'P = region(A, 0, 16, elem=f16, shape=[2, 4], layout=AB)\nQ = region(A, 16, 24, elem=f16, shape=[2, 6], '
                           'layout=AB)\nY = region(B, 0, 40, elem=f16, shape=[2, 10], layout=AB)\nt = concat.async in P, Q out Y axis=1\n',
'concat_shape': LITE + BUFS + 'P = region(A, 0, 16, elem=f16, shape=[2, 4], layout=AB)\nQ = region(A, 16, 24, elem=f16, shape=[3, 4], '
                              'layout=AB)\nY = region(B, 0, 40, elem=f16, shape=[2, 8], layout=AB)\nt = concat.async in P, Q out Y axis=1 '
                              ' #! compute.shape every axis but 1\n',
'split_sizes': LITE + BUFS + 'X = region(A, 0, 40, elem=f16, shape=[2, 10], layout=AB)\nP = region(B, 0, 16, elem=f16, shape=[2, 4], '
                             'layout=AB)\nQ = region(B, 16, 24, elem=f16, shape=[2, 6], layout=AB)\nt = split.async in X out P, Q axis=1 '
                             'split_sizes=[4, 5]  #! compute.shape sum to 9|10\n',
'slice_shape': LITE + BUFS + 'X = region(A, 0, 40, elem=f16, shape=[2, 10], layout=AB)\nY = region(B, 0, 40, elem=f16, shape=[2, 4], '
                             'layout=AB)\nt = slice.async in X out Y starts=[1] ends=[9] axes=[1] steps=[2]\n',
'slice_bad': LITE + BUFS + 'X = region(A, 0, 40, elem=f16, shape=[2, 10], layout=AB)\nY = region(B, 0, 40, elem=f16, shape=[2, 5], '
                           'layout=AB)\nt = slice.async in X out Y starts=[1] ends=[9] axes=[1] steps=[2]  #! compute.shape [2, 4]\n',
'pad_shape': LITE + BUFS + 'X = region(A, 0, 40, elem=f16, shape=[2, 10], layout=AB)\nY = region(B, 0, 80, elem=f16, shape=[4, 10], '
                           'layout=AB)\nt = pad.async in X out Y pads=[1, 1, 1, 1] mode=constant  #! compute.shape [4, 12]\n',
'pad_mode': LITE + BUFS + 'X = region(A, 0, 40, elem=f16, shape=[2, 10], layout=AB)\nY = region(B, 0, 96, elem=f16, shape=[4, 12], '
                          'layout=AB)\nt = pad.async in X out Y pads=[1, 1, 1, 1] mode=wrap  #! compute.attr-value mode\n',
'gather_indices_type': LITE + BUFS + 'X = region(A, 0, 40, elem=f16, shape=[10, 2], layout=AB)\nI = region(A, 64, 8, elem=f16, shape=[4], '
                                     'layout=C)\nY = region(B, 0, 16, elem=f16, shape=[4, 2], layout=AB)\nt = gather.async in X, I out Y '
                                     'axis=0  #! compute.shape indices|integer\n',
'norm_scale_shape': LITE + BUFS + 'X = region(A, 0, 64, elem=f16, shape=[4, 8], layout=AB)\nS = region(A, 64, 8, elem=f16, shape=[4], '
                                  'layout=C)\nY = region(B, 0, 64, elem=f16, shape=[4, 8], layout=AB)\nt = layernorm.async in X, S out Y '
                                  'axis=1 epsilon=1.0e-5  #! compute.shape X.shape[axis:]|[8]\n',
'norm_ok': LITE + BUFS + 'X = region(A, 0, 64, elem=f16, shape=[4, 8], layout=AB)\nS = region(A, 64, 16, elem=f16, shape=[8], '
                         'layout=C)\nY = region(B, 0, 64, elem=f16, shape=[4, 8], layout=AB)\nt = rmsnorm.async in X, S out Y axis=-1 '
                         'epsilon=0.00001\n',
'softmax_axis': LITE + BUFS + 'X = region(A, 0, 64, elem=f16, shape=[4, 8], layout=AB)\nY = region(B, 0, 64, elem=f16, shape=[4, 8], '
                              'layout=AB)\nt = softmax.async in X out Y axis=2  #! compute.attr-value axis 2\n',
'reduce_future': LITE + BUFS + 'X = region(A, 0, 64, elem=f16, shape=[4, 8], layout=AB)\nY = region(B, 0, 8, elem=f16, shape=[4], '
                               'layout=A)\nt = reduce_sum.async in X out Y axes=[1] keepdims=0  #!i compute.status future\n',
'argmax_output_int': LITE + BUFS + 'X = region(A, 0, 64, elem=f16, shape=[4, 8], layout=AB)\nY = region(B, 0, 8, elem=f16, shape=[4, 1], '
                                   'layout=AB)\nt = argmax.async in X out Y axis=1 keepdims=1  #! type.no-family integer indices\n',
'generic_compute_warns': LITE + 'x = compute.async(op="fancy", attrs={k=1})  #!w compute.generic fancy\n',
'generic_compute_no_op': LITE + 'x = compute.async(attrs={k=1})  #! compute.generic op=\n',
# ---------------- type legality ----------------
'type_i8_conv_ok': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 1024, elem=i8, shape=[1, 8, 8, 16], layout=NHWC, '
                          'quant=per_tensor(scale=0.1, zero_point=0))\nW = region(A, 1024, 4608, elem=i8, shape=[3, 3, 16, 32], '
                          'layout=HWIO, quant=per_tensor(scale=0.1, zero_point=0))\nY = region(A, 8192, 1152, elem=i8, shape=[1, 6, 6, '
                          '32], layout=NHWC)\nt = conv2d.async in X, W out Y pads=[0, 0, 0, 0] strides=[1, 1] dilations=[1, 1] '
                          'accum_type=i32\n',
'type_i8_conv_no_quant': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 1024, elem=i8, shape=[1, 8, 8, 16], layout=NHWC)\nW = '
                                'region(A, 1024, 4608, elem=i8, shape=[3, 3, 16, 32], layout=HWIO)\nY = region(A, 8192, 1152, elem=i8, '
                                'shape=[1, 6, 6, 32], layout=NHWC)\nt = conv2d.async in X, W out Y pads=[0, 0, 0, 0] strides=[1, 1] '
                                'dilations=[1, 1] accum_type=i32  #! type.illegal conv2d.int8<i8>.no_bias|X needs a quant descriptor\n',
'type_accum': LITE + BUFS + 'P = region(A, 0, 32, elem=f16, shape=[4, 4], layout=MK)\nQ = region(B, 0, 32, elem=f16, shape=[4, 4], '
                            'layout=KN)\nR = region(A, 64, 32, elem=f16, shape=[4, 4], layout=MN)\nt = gemm.async in P, Q out R '
                            'accum_type=f16  #! type.illegal gemm.float<f16>.no_bias|needs f32\n',
'type_mixed_eltwise': LITE + BUFS + 'X = region(A, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nZ = region(A, 128, 128, elem=bf16, '
                                    'shape=[1, 64], layout=NC)\nY = region(B, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nt = add.async '
                                    'in X, Z out Y  #! type.illegal eltwise<f16>.default|bf16, needs f16\n',
'type_device_f32': LITE + BUFS + 'X = region(A, 0, 256, elem=f32, shape=[1, 64], layout=NC)\nY = region(B, 0, 256, elem=f32, shape=[1, '
                                 '64], layout=NC)\nt = relu.async in X out Y  #! type.device '
                                 'eltwise<f32>.default|npm_lite|eltwise<f16>.default\n',
'type_device_gemm_f32': LITE + BUFS + 'P = region(A, 0, 64, elem=f32, shape=[4, 4], layout=MK)\nQ = region(B, 0, 64, elem=f32, shape=[4, '
                                      '4], layout=KN)\nR = region(A, 128, 64, elem=f32, shape=[4, 4], layout=MN)\nt = gemm.async in P, Q '
                                      'out R accum_type=f32  #! type.device gemm.float<f32>.no_bias|npm_lite\n',
'type_device_ok_extended': 'include "devices/npm_pro_x1.nem"\ndevice '
                           'npm_pro_x1\n' + BUFS + 'P = region(A, 0, 64, elem=f32, shape=[4, 4], layout=MK)\nQ = region(B, 0, 64, '
                                                   'elem=f32, shape=[4, 4], layout=KN)\nR = region(A, 128, 64, elem=f32, shape=[4, 4], '
                                                   'layout=MN)\nt = gemm.async in P, Q out R accum_type=f32\n',
'type_portability_info': BUFS + 'X = region(A, 0, 256, elem=f32, shape=[1, 64], layout=NC)\nY = region(B, 0, 256, elem=f32, shape=[1, '
                                '64], layout=NC)\nt = relu.async in X out Y  #!i type.portability MAY|eltwise<f32>.default\n',
'type_quantize_dst_quant': LITE + BUFS + 'X = region(A, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nY = region(B, 0, 64, elem=i8, '
                                         'shape=[1, 64], layout=NC)\nt = quantize.async in X out Y  #! type.illegal quantize<f16, '
                                         'i8>.default|Y needs a quant descriptor\n',
'type_cast_any_ok': LITE + BUFS + 'X = region(A, 0, 256, elem=f32, shape=[1, 64], layout=NC)\nY = region(B, 0, 64, elem=i8, shape=[1, '
                                  '64], layout=NC)\nt = cast.async in X out Y\n',
'type_pool_changes_type': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 2048, elem=f16, shape=[1, 8, 8, 16], layout=NHWC)\nY = '
                                 'region(A, 4096, 1024, elem=f32, shape=[1, 4, 4, 16], layout=NHWC)\nt = maxpool.async in X out Y '
                                 'kernel_shape=[2, 2] pads=[0, 0, 0, 0] strides=[2, 2]  #! type.no-family preserves\n',
# ---------------- decorators ----------------
'deco_unknown': LITE + BUFS + X16 + 't = relu.async in X out Y\n    @materialised  #! deco.unknown materialised|materialized\n',
'deco_unknown_region': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 8) @fast  #! deco.unknown @fast\n',
'deco_args_max_in_flight': 'loop i in [0..3] @max_in_flight:  #! deco.args max_in_flight|1 argument\n  wait(x)  #! token.undefined '
                           'x\nendloop\n',
'deco_args_readonly': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 8) @readonly(1)  #! deco.args no arguments\n',
'deco_target_max_in_flight': LITE + BUFS + X16 + 't = relu.async in X out Y\n    @max_in_flight(2)  #! deco.target loop\n',
'deco_target_memmove_compute': LITE + BUFS + X16 + 't = relu.async in X out Y\n    @memmove  #! deco.target memmove\n',
'deco_target_resource_on_loop': 'loop i in [0..1] @resource(NMU[0]):  #! deco.target resource\n  wait(x)  #! token.undefined x\nendloop\n',
'deco_max_in_flight_zero': 'loop i in [0..3] @max_in_flight(0):  #! deco.max-in-flight N >= 1\n  wait(x)  #! token.undefined x\nendloop\n',
'deco_max_in_flight_negative': 'const N = 0 - 2\nloop i in [0..3] @max_in_flight(N):  #! deco.max-in-flight -2\n  wait(x)  #! '
                               'token.undefined x\nendloop\n',
'deco_resource_seq': LITE + BUFS + X16 + 't = relu.async in X out Y @resource(SEQ[0])  #! deco.resource SEQ|not '
                                         'allowed\n'.replace('out Y @resource',
                                                             'out Y\n    @resource').replace('Y\n    @resource(SEQ[0])  #!',
                                                                                             'Y\n    @resource(SEQ[0])  #!'),
'deco_resource_sdma': 'buffer P : DDR (size=64)\nbuffer Q : L2 (size=64)\nt = transfer.async(dst=Q, src=P) @resource(sDMA[0])  #! '
                      'deco.resource sDMA\n',
'deco_resource_wdm': 'buffer P : DDR (size=64)\nbuffer Q : L2 (size=64)\nt = transfer.async(dst=Q, src=P) @resource(WDM[1])  #! '
                     'deco.resource WDM|device-level\n',
'deco_resource_remap_info': LITE + BUFS + X16 + 't = relu.async in X out Y\n    @resource(CSTL[3])  #!i deco.resource remapped|2 CSTL\n',
'deco_resource_cross_unit': LITE + BUFS + X16 + 't = relu.async in X out Y\n    @resource(NMU[0])  #!w deco.resource cross-type|CSTL\n',
'deco_resource_vpu_ok': LITE + BUFS + X16 + 't = relu.async in X out Y\n    @resource(VPU[0])\n',
'deco_seq_engine_range': LITE + 'buffer P : DDR (size=64)\nbuffer Q : L2 (size=64)\nt = transfer.async(dst=Q, src=P) @seq_engine(2)  #! '
                                'deco.seq-engine engines 0..0\n',
'deco_seq_engine_ok': PRO + 'buffer P : DDR (size=64)\nbuffer Q : L2 (size=64)\nt = transfer.async(dst=Q, src=P) @seq_engine(3)\n',
'deco_access_readonly_written': LITE + BUFS + 'X = region(A, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nY = region(B, 0, 128, elem=f16, '
                                              'shape=[1, 64], layout=NC) @readonly\nt = relu.async in X out Y  #! deco.access writes '
                                              'Y|@readonly\n',
'deco_access_writeonly_read': LITE + BUFS + 'X = region(A, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nY = region(B, 0, 128, elem=f16, '
                                            'shape=[1, 64], layout=NC)\nt = relu.async in X @writeonly out Y  #! deco.access reads '
                                            'X|@writeonly\n',
'deco_debug_profile_ok': LITE + BUFS + X16 + 't = relu.async in X out Y\n    @debug("relu1") @profile(hot) @deterministic\n',
# ---------------- placement ----------------
'placement_two_l1': PRO + 'buffer P : L1[0] (size=256)\nbuffer Q : L1[1] (size=256)\nX = region(P, 0, 128, elem=f16, shape=[1, 64], '
                          'layout=NC)\nY = region(Q, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nt = relu.async in X out Y  #! '
                          'placement.multi-engine L1[0]|L1[1]\n',
'placement_transfer_two_l1': PRO + 'buffer P : L1[0] (size=256)\nbuffer Q : L1[2] (size=256)\nt = transfer.async(dst=Q, src=P)  #! '
                                   'placement.multi-engine L1[2]\n',
'placement_seq_engine_conflict': PRO + 'buffer P : L2 (size=256)\nbuffer Q : L1[1] (size=256)\nt = transfer.async(dst=Q, src=P) '
                                       '@seq_engine(0)  #! placement.seq-engine engine 1\n',
'placement_same_engine_ok': PRO + 'buffer P : L1[2] (size=256)\nbuffer Q : L1[2] (size=256)\nbuffer R : L2 (size=256)\nt = '
                                  'transfer.async(dst=Q, src=R) @seq_engine(2)\nu = transfer.async(dst=P, src=Q, deps=[t])\n',
# ---------------- tokens ----------------
'token_undefined_dep': LITE + BUFS + X16 + 't = relu.async in X out Y deps=[nope]  #! token.undefined nope\n',
'token_undefined_wait': 'wait(ghost)  #! token.undefined ghost\n',
'token_later_toplevel': LITE + BUFS + X16 + 'wait(t)  #! token.undefined t\nt = relu.async in X out Y\n',
'token_loop_carried_ok': LITE + BUFS + 'loop i in [0..3]:\n  let X = region(A, 0, 128, elem=f16, shape=[1, 64], layout=NC)\n  let Y = '
                                       'region(B, 0, 128, elem=f16, shape=[1, 64], layout=NC)\n  t1 = relu.async in X out Y deps=[t2]\n  '
                                       't2 = relu.async in Y out X deps=[t1]\nendloop\n',
'token_not_token': LITE + BUFS + X16 + 't = relu.async in X out Y deps=[X]  #! token.not-token X|region\n',
'token_not_token_const': 'const K = 1\nwait(K)  #! token.not-token K|constant\n',
'token_wait_assign': LITE + BUFS + X16 + 't = relu.async in X out Y\nw = wait(t)  #! token.wait-assign no token\n',
'token_wait_assign_loop': 'buffer P : L2 (size=64)\nbuffer Q : L1 (size=64)\nloop i in [0..1]:\n  t = transfer.async(dst=Q, src=P)\n  w = '
                          'wait(t)  #! token.wait-assign w\nendloop\n',
# ---------------- hazards ----------------
'hazard_raw': LITE + BUFS + 'X = region(A, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nY = region(B, 0, 128, elem=f16, shape=[1, 64], '
                            'layout=NC)\nt = transfer.async(dst=X, src=region(G, 0, 128))\nr = relu.async in X out Y  #! hazard.write '
                            'reads X|transfer task t|no dependency\n',
'hazard_raw_fixed_by_deps': LITE + BUFS + X16 + 't = transfer.async(dst=X, src=region(G, 0, 128))\nr = relu.async in X out Y deps=[t]\n',
'hazard_raw_fixed_by_wait': LITE + BUFS + X16 + 't = transfer.async(dst=X, src=region(G, 0, 128))\nwait(t)\nr = relu.async in X out Y\n',
'hazard_raw_fixed_by_sync': LITE + BUFS + X16 + 't = transfer.sync(dst=X, src=region(G, 0, 128))\nr = relu.async in X out Y\n',
'hazard_waw': 'buffer P : L2 (size=64)\nbuffer Q : L1 (size=64)\nt = transfer.async(dst=region(Q, 0, 32), src=region(P, 0, 32))\nu = '
              'transfer.async(dst=region(Q, 16, 32), src=region(P, 32, 32))  #! hazard.write writes|[16, 48)|[0, 32)\n',
'hazard_war_pingpong_without_mif': LITE + BUFS + 'loop i in [0..3] @max_in_flight(2):\n  let X = region(A, 0, 128, elem=f16, shape=[1, '
                                                 '64], layout=NC)\n  let Y = region(B, (i mod 2) * 128, 128, elem=f16, shape=[1, 64], '
                                                 'layout=NC)\n  t = transfer.async(dst=X, src=region(G, i * 128, 128))  #! hazard.write '
                                                 'writes X\n  r = relu.async in X out Y deps=[t]  #! hazard.write reads X\nendloop\n',
'hazard_pingpong_ok': LITE + BUFS + 'loop i in [0..7] @max_in_flight(2):\n  let X = region(A, (i mod 2) * 128, 128, elem=f16, shape=[1, '
                                    '64], layout=NC)\n  let Y = region(B, (i mod 2) * 128, 128, elem=f16, shape=[1, 64], layout=NC)\n  t '
                                    '= transfer.async(dst=X, src=region(G, i * 128, 128))\n  r = relu.async in X out Y deps=[t]\n  s = '
                                    'store.async(dst=region(G, 4096 + i * 128, 128), src=Y, deps=[r])\nendloop\n',
'hazard_memmove': 'buffer P : L2 (size=256)\nt = transfer.async(dst=region(P, 32, 64), src=region(P, 0, 64))  #! hazard.memmove '
                  '@memmove|overlap\n',
'hazard_memmove_ok': 'buffer P : L2 (size=256)\nt = transfer.async(dst=region(P, 32, 64), src=region(P, 0, 64)) @memmove\n',
'hazard_memmove_loop': 'buffer P : L2 (size=256)\nloop i in [0..1]:\n  t = transfer.async(dst=region(P, i * 8 + 4, 16), src=region(P, i * '
                       '8, 16))  #! hazard.memmove overlap\nendloop\n',
'hazard_imported_alias': LITE + 'buffer P : L2 (size=64) @import\nbuffer Q : L2 (size=64) @import\nt = transfer.async(dst=region(P, 0, '
                                '32), src=region(G2, 0, 32))  #! region.buffer G2\nu = transfer.async(dst=region(Q, 0, 32), src=region(P, '
                                '32, 32))  #! hazard.write imported|writes\n'.replace('region(G2, 0, 32))  #! region.buffer G2',
                                                                                      'region(P, 32, 32))').replace('u = transfer.async(dst=region(Q, 0, 32), src=region(P, 32, 32))  #! hazard.write imported|writes', 'u = transfer.async(dst=region(Q, 0, 32), src=region(P, 48, 16))  #! hazard.write writes'),
}

# ---------------- second cases for the remaining rules ----------------
CASES.update({
'transfer_extent_store': 'buffer P : L1 (size=128)\nbuffer Q : L2 (size=128)\nt = store.async(dst=region(Q, 0, 16), src=region(P, 0, 64)) '
                         ' #! transfer.extent 64 bytes|only 16\n',
'transfer_operand_token': 'buffer P : L2 (size=64)\nbuffer Q : L1 (size=64)\nt = transfer.async(dst=Q, src=P)\nu = transfer.async(dst=Q, '
                          'src=t, deps=[t])  #! transfer.operand t|token\n',
'status_future_conv3d': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 1024, elem=f16, shape=[1, 4, 4, 4, 8], layout=NDHWC)\nW = '
                               'region(A, 1024, 432, elem=f16, shape=[3, 3, 3, 8, 1], layout=DHWIO)\nY = region(A, 2048, 16, elem=f16, '
                               'shape=[1, 2, 2, 2, 1], layout=NDHWC)\nt = conv3d.async in X, W out Y pads=[0, 0, 0, 0, 0, 0] strides=[1, '
                               '1, 1] dilations=[1, 1, 1] accum_type=f32  #!i compute.status conv3d|future\n',
'portability_gemm_bf16': BUFS + 'P = region(A, 0, 32, elem=bf16, shape=[4, 4], layout=MK)\nQ = region(B, 0, 32, elem=bf16, shape=[4, 4], '
                                'layout=KN)\nR = region(A, 64, 32, elem=bf16, shape=[4, 4], layout=MN)\nt = gemm.async in P, Q out R '
                                'accum_type=f32  #!i type.portability gemm.float<bf16>.no_bias\n',
'seq_engine_negative': 'buffer P : DDR (size=64)\nbuffer Q : L2 (size=64)\nt = transfer.async(dst=Q, src=P) @seq_engine(0 - 1)  #! '
                       'deco.seq-engine -1\n',
'placement_seq_engine_compute': PRO + 'buffer P : L1[3] (size=256)\nX = region(P, 0, 128, elem=f16, shape=[1, 64], layout=NC)\nY = '
                                      'region(P, 128, 128, elem=f16, shape=[1, 64], layout=NC)\nt = relu.async in X out Y\n    '
                                      '@seq_engine(1)  #! placement.seq-engine L1[3]|engine 3\n',
'expr_mod_zero_shape': 'buffer Z : L2 (size=64)\nR = region(Z, 0, 8, elem=i8, shape=[8 mod 0], layout=C)  #! expr.div-zero mod by zero\n',
'expr_float_offset': 'buffer Z : L2 (size=64)\nR = region(Z, 0.5, 8)  #! expr.float 0.5\n',
'loop_empty_const_bounds': 'const N = 0\nloop i in [0..N - 1]:  #!w loop.bounds [0..-1]\n  wait(x)\nendloop\n',
'deco_target_resource_on_operand': LITE + BUFS + X16 + 't = relu.async in X out Y @resource(CSTL[0])  #! deco.target cannot decorate an '
                                                       'operand|next line\n',
'deco_target_memmove_store': 'buffer P : L1 (size=128)\nbuffer Q : L2 (size=128)\nt = store.async(dst=Q, src=P) @memmove  #! deco.target '
                             'applies to transfer\n',
'deco_args_resource_plain': LITE + BUFS + X16 + 't = relu.async in X out Y\n    @resource(2)  #! deco.args UNIT[index]\n',
'compute_generic_ok_in_loop': LITE + 'loop i in [0..1]:\n  x = compute.async(op="custom", attrs={k: i})  #!w compute.generic '
                                     'custom\nendloop\n',
'name_duplicate_loopvar': 'const i = 3  #! const.name-conflict i|loop variable\nloop i in [0..1]:  #! name.duplicate shadows|constant\n  '
                          'wait(x)  #! token.undefined x\nendloop\n',
})

# ---------------- sequencer token limit (SEQ.max_active_tokens) ----------------
_many = ''.join(f'x{k} = transfer.async(dst=region(B, {k * 8}, 8), src=region(G, {k * 8}, 8))\n' for k in range(16))
CASES.update({
'token_limit_lite': LITE + BUFS + _many + 'x16 = transfer.async(dst=region(B, 128, 8), src=region(G, 128, 8))  #!w token.limit '
                                          '17|16|npm_lite\n',
'token_limit_ok_with_wait': LITE + BUFS + _many + 'wait(' + ', '.join(f'x{k}' for k in range(16)) + ')\nx16 = transfer.async(dst=region(B, 128, 8), src=region(G, 128, 8))\n',
'token_limit_pro_32': PRO + BUFS + _many + ''.join(f'y{k} = transfer.async(dst=region(B, {256 + k * 8}, 8), src=region(G, '
                                                   f'{256 + k * 8}, 8))\n' for k in range(16)) + 'z = transfer.async(dst=region(B, 1024, '
                                                                                          '8), src=region(G, 1024, 8))  #!w '
                                                                                          'token.limit 33|32\n',
})

# ---------------- let bindings (decision NEM 2) ----------------
CASES.update({
'let_int_in_loop_ok': LITE + BUFS + 'loop i in [0..3]:\n  let off = (i mod 2) * 128\n  let X = region(A, off, 128, elem=f16, shape=[1, '
                                    '64], layout=NC)\n  let Y = region(B, off, 128, elem=f16, shape=[1, 64], layout=NC)\n  t = relu.sync '
                                    'in X out Y\nendloop\n',
'let_int_oob': 'buffer Z : L2 (size=64)\nloop i in [0..3]:\n  let off = i * 32\n  let R = region(Z, off, 32)  #! region.bounds '
               'off=96|[96, 128)\nendloop\n',
'let_alias_region': LITE + BUFS + X16 + 'let Cur = X\nt = relu.async in Cur out Y\nu = relu.async in Y out Cur  #! hazard.write reads '
                                        'Y|relu task t\n',
'let_float_not_integer': 'const K = 2\nlet eps = 0.5\nbuffer Z : L2 (size=eps * K)  #! expr.undefined eps\n',
})

# ---------------- opcode layouts (decision NEM 7: conv X NHWC, W HWIO) ----------------
CASES.update({
'conv_layout_nchw': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 2048, elem=f16, shape=[1, 16, 8, 8], layout=NCHW)\nW = region(A, '
                           '2048, 9216, elem=f16, shape=[3, 3, 16, 32], layout=HWIO)\nY = region(A, 12288, 2304, elem=f16, shape=[1, 6, '
                           '6, 32], layout=NHWC)\nt = conv2d.async in X, W out Y pads=[0, 0, 0, 0] strides=[1, 1] dilations=[1, 1] '
                           'accum_type=f32  #! compute.layout NCHW|NHWC\n',
'pool_layout': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 2048, elem=f16, shape=[1, 8, 8, 16], layout=NHWC)\nY = region(A, '
                      '4096, 512, elem=f16, shape=[1, 4, 4, 16], layout=NCHW)\nt = maxpool.async in X out Y kernel_shape=[2, 2] pads=[0, '
                      '0, 0, 0] strides=[2, 2]  #! compute.layout Y|NCHW\n',
'conv_strides_no_layout_ok': LITE + 'buffer A : L1 (size=65536)\nX = region(A, 0, 2048, elem=f16, shape=[1, 8, 8, 16], strides=[1024, '
                                    '128, 16, 1])\nW = region(A, 2048, 9216, elem=f16, shape=[3, 3, 16, 32], layout=HWIO)\nY = region(A, '
                                    '12288, 2304, elem=f16, shape=[1, 6, 6, 32], layout=NHWC)\nt = conv2d.async in X, W out Y pads=[0, 0, '
                                    '0, 0] strides=[1, 1] dilations=[1, 1] accum_type=f32\n',
})

# ---------------- the 64-bit integer range (notebook 30 ruling) and the simulation budget ----------------
CASES.update({
'const_range_square': 'const A = 4294967296\nconst B = A * A  #! const.range 4294967296 * 4294967296|64-bit\nconst C = B + 1\n',
'const_range_negate': 'const A = 0 - 9223372036854775807 - 1\nconst B = -A  #! const.range -(-9223372036854775808)|64-bit\n',
'expr_range_size': 'const K = 3037000500\nbuffer Z : DDR (size=K * K)  #! expr.range 3037000500 * 3037000500|outside\n',
'expr_range_loop': 'buffer Z : L2 (size=64)\nloop i in [0..4611686018427387904 * 4]:  #! expr.range 4611686018427387904 * 4\n  '
                   'wait(x)\nendloop\n',
'device_unknown_name': 'include "devices/npm_lite.nem"\ndevice npm_max  #! device.unknown npm_max|npm_lite\nconst a = 1\n',
'device_unknown_file': 'device "no/such_device.nem"  #! device.unknown no/such_device.nem|not found\nconst a = 1\n',
'hazard_budget_max_in_flight': 'buffer Z : L2 (size=64)\nloop i in [0..100000] @max_in_flight(50000):  #!i hazard.budget '
                               '@max_in_flight(50000)|64 iterations\n  t = store.async(dst=region(Z, 0, 8), src=region(Z, 8, 8))  #! '
                               'hazard.write writes|no dependency\nendloop\n',
'hazard_budget_deep_nest': 'buffer Z : L2 '
                           '(size=64)\n' + ''.join('  ' * k + f'loop i{k} in [0..1]:' + ('  #!i hazard.budget '
                                                                                         'nested 4 deep' if k == 3 else '') + '\n' for k in range(5)) + '          t = transfer.sync(dst=region(Z, 0, 8), src=region(Z, 8, 8))\n' + ''.join('  ' * k + 'endloop\n' for k in reversed(range(5))),
})

# ---------------- malformed type families (notebook 32: family_problems; reported by DeviceSet) ----------------
# config documents: a family's faults are diagnostics at the binding / entry / type, never an exception
FAM1 = 'type_family myfam<T: {f16, f32}> {\n  input: T\n  output: T\n  variants:\n  default: { }\n'
CASES.update({
'family_ok': FAM1 + '  conformance: { MUST <f16> MAY <f32> }\n}\n',
'family_conformance_too_many': FAM1 + '  conformance: { MUST <f16, f32> }  #! family.conformance MUST <f16, f32>|2 type(s)|<T>\n}\n',
'family_conformance_missing': FAM1 + '  conformance: { MUST <f16> MAY }  #! family.conformance MAY gives 0|<T>\n}\n',
'family_conformance_unparameterized': 'type_family plain {\n  src: any_supported\n  dst: any_supported\n  variants:\n  default: { }\n'
                                      '  conformance: { MUST <f16> }  #! family.conformance myfam|no type '
                                      'instantiation\n}\n'.replace('myfam', 'plain'),
'family_type_set': FAM1 + '  conformance: { MUST <f16> MAY <i8> }  #! family.type-set i8|type set of T|{f16, f32}\n}\n',
'family_type_set_second_param': 'type_family q2<T_src: {f16, f32}, T_dst: {i8}> {\n  src: T_src\n  dst: T_dst\n  quant = required on '
                                'dst\n  variants:\n'
                                '  default: { }\n  conformance: { MUST <f16, i8>\n    MAY <f32, i4> }  #! family.type-set '
                                'i4|T_dst|{i8}\n}\n',
'family_binding_family_level': 'type_family myfam<T: {f16, f32}> {\n  input: T\n  output: U  #! family.binding output|\'U\'|its '
                               'parameters are T\n'
                               '  variants:\n  default: { }\n  conformance: { MUST <f16> }\n}\n',
'family_binding_variant_level': 'type_family g2<T: {f16}> {\n  A: T\n  Y: T\n  variants:\n  no_bias: { C: absent }\n  conformance: { MUST '
                                '<f16> }\n'
                                '  with_bias: { C: Tc }  #! family.binding variant with_bias|operand C|\'Tc\'\n  conformance: { MAY '
                                '<f16> }\n}\n',
'family_attribute_accum': 'type_family g3<T: {f16}> {\n  A: T\n  Y: T\n  accum = f64  #! family.attribute accum = f64|element type\n'
                          '  variants:\n  default: { }\n  conformance: { MUST <f16> }\n}\n',
'family_attribute_quant': 'type_family g4<T: {f16}> {\n  A: T\n  Y: T\n  quant = maybe  #! family.attribute quant = maybe|required or '
                          'absent\n'
                          '  variants:\n  default: { }\n  conformance: { MUST <f16> }\n}\n',
'family_attribute_quant_on': 'type_family g5<T: {f16}> {\n  src: T\n  dst: T\n  quant = required on Z  #! family.attribute binds no '
                             'operand Z|dst, src\n'
                             '  variants:\n  default: { }\n  conformance: { MUST <f16> }\n}\n',
# the broken family is left out: a device listing its variant gets no device.unknown-variant on top, and the
# check goes on (the device's own fault is still reported)
'family_broken_no_cascade': 'include "nem_baseline_1.0.nem"\n' + FAM1 + '  conformance: { MUST <f16> MAY <bf16> }  #! family.type-set '
                                                                        'bf16\n}\n'
                            'device m extends nem_baseline_1_0 {\n  topology { num_engines = 0 l2_size_bytes = 1000 per_engine { NMU = 1 '
                            'l1_size_bytes = 100 } }  #! device.counts num_engines\n'
                            '  opcode.extended { myfam<f16>.default }\n}\n',
})

@pytest.mark.parametrize('name', sorted(CASES))
def test_rule_case(name):
    run_case(CASES[name])

def test_every_rule_covered_twice():
    "Each rule id of the checker is exercised by at least two cases (valid cases do not count)."
    counts = {}
    for src in CASES.values():
        for sev, rule, line, words in expectations(src):
            counts[rule] = counts.get(rule, 0) + 1
    rules = ['const.duplicate', 'const.integer', 'const.non-const', 'const.forward-ref', 'const.div-zero', 'const.in-loop',
             'const.name-conflict',
             'expr.undefined', 'name.duplicate', 'buffer.size', 'buffer.align', 'buffer.level', 'memory.capacity',
             'region.buffer', 'region.bounds', 'region.types', 'region.extent', 'region.layout', 'region.quant',
             'transfer.types', 'compute.operands', 'compute.untyped', 'compute.attrs', 'compute.attr-value', 'compute.shape',
             'compute.generic', 'type.illegal', 'type.device', 'type.no-family', 'deco.unknown', 'deco.args', 'deco.target',
                 'deco.resource',
             'deco.max-in-flight', 'deco.access', 'placement.multi-engine', 'token.undefined', 'token.not-token', 'token.wait-assign',
             'hazard.write', 'hazard.memmove', 'transfer.extent', 'transfer.operand', 'compute.status', 'type.portability',
             'deco.seq-engine', 'placement.seq-engine', 'expr.div-zero', 'expr.float', 'loop.bounds', 'compute.layout', 'token.limit']
    rules += ['const.range', 'expr.range', 'hazard.budget']
    low = {r: counts.get(r, 0) for r in rules if counts.get(r, 0) < 2}
    assert not low, low

def test_rule_list_matches_the_checker():
    ("The rule ids the checker source can emit are exactly those that have cases here or in test_nem_devices (so a new rule cannot go "
     "untested).")
    import inspect, nac_lab.nem.analysis.check_ctx, nac_lab.nem.analysis.shapes, nac_lab.nem.analysis.hazards, nac_lab.nem.analysis.check
    src = ''.join(inspect.getsource(m) for m in (nac_lab.nem.analysis.check_ctx, nac_lab.nem.analysis.shapes, nac_lab.nem.analysis.hazards, nac_lab.nem.analysis.check))
    emitted = set(re.findall(r"'(?:error|warning|info)', f?'([a-z-]+\.[a-z-]+)'", src))
    import nac_lab.nem.front.types as typ     # the malformed-family rules: found in nem.types, reported through DeviceSet
    fam_rules = set(re.findall(r"'(family\.[a-z-]+)'", inspect.getsource(typ)))
    assert {'family.conformance', 'family.type-set', 'family.binding', 'family.attribute'} <= fam_rules, fam_rules
    emitted |= fam_rules
    assert {'const.range', 'hazard.budget', 'token.limit', 'compute.shape'} <= emitted and len(emitted) > 50, sorted(emitted)
    emitted |= {f'expr.{k}' for k in ('undefined', 'div-zero', 'float', 'range')} | {'transfer.operand'}
    counts = {}
    for s in CASES.values():
        for sev, rule, line, words in expectations(s): counts[rule] = counts.get(rule, 0) + 1
    # `expr.type` needs a non-integer expression node where an integer is evaluated; the parser never builds one there
    low = {r: counts.get(r, 0) for r in emitted - {'expr.type'} if counts.get(r, 0) < 2}
    assert not low, low

def test_case_count():
    assert len(CASES) >= 80
