"""The `onnx` package's own operator test cases through the ONNX importer: the first case of every operator the importer has.

Each case (`onnx.backend.test.case.node.collect_testcases()`) is a model, its inputs and the outputs of ONNX's reference
implementation: nobody here wrote them. The whole set runs with `python -m nac_lab.onnx.conformance` (pass counts per
operator); here a fixed sample, one case per operator, runs in every test pass. A case either passes (outputs equal within
the tolerances of `nac_lab.onnx.conformance`) or is one of the refusals listed below, each with the reason the importer
gives: the shape, axis or pad argument is a float graph input (only integer and boolean inputs are frozen to their example
values), bfloat16 test data, cubic interpolation.
"""
import pytest

pytest.importorskip('onnx')
from nac_lab.onnx.conformance import node_cases, run_case, op_table   # noqa: E402

# the first case (by name) of each single-node operator the importer implements, onnx 1.23
SAMPLE = [
    'test_abs', 'test_acos', 'test_acosh', 'test_add', 'test_and2d', 'test_argmax_default_axis_example',
    'test_argmin_default_axis_example', 'test_asin', 'test_asinh', 'test_atan', 'test_atanh', 'test_averagepool_1d_default',
    'test_basic_conv_with_padding', 'test_batchnorm_epsilon', 'test_bitshift_left_int16', 'test_bitwise_and_i16_3d',
    'test_bitwise_not_2d', 'test_bitwise_or_i16_4d', 'test_bitwise_xor_i16_3d', 'test_cast_BFLOAT16_to_FLOAT',
    'test_castlike_BFLOAT16_to_FLOAT', 'test_ceil', 'test_celu', 'test_clip', 'test_concat_1d_axis_0', 'test_constant',
    'test_constant_pad', 'test_constantofshape_float_ones', 'test_convtranspose', 'test_cos', 'test_cosh', 'test_cumsum_1d',
    'test_depthtospace_crd_mode_example', 'test_dequantizelinear', 'test_div', 'test_dropout_default', 'test_dynamicquantizelinear',
    'test_einsum_batch_diagonal', 'test_elu', 'test_equal', 'test_erf', 'test_exp', 'test_expand_dim_changed', 'test_flatten_axis0',
    'test_floor', 'test_gather_0', 'test_gather_elements_0', 'test_gathernd_example_float32', 'test_gelu_default_1',
    'test_gemm_all_attributes', 'test_globalaveragepool', 'test_globalmaxpool', 'test_greater', 'test_greater_equal',
    'test_group_normalization_epsilon', 'test_hardmax_axis_0', 'test_hardsigmoid', 'test_hardswish', 'test_identity',
    'test_instancenorm_epsilon', 'test_isinf', 'test_isnan', 'test_l1normalization_axis_0', 'test_layer_normalization_2d_axis0',
    'test_leakyrelu', 'test_less', 'test_less_equal', 'test_log', 'test_logsoftmax_axis_0', 'test_lrn', 'test_matmul_1d_1d',
    'test_matmulinteger', 'test_max_example', 'test_maxpool_1d_default', 'test_mean_example', 'test_min_example', 'test_mish',
    'test_mod_broadcast', 'test_mul', 'test_mvn', 'test_neg', 'test_not_2d', 'test_onehot_negative_indices', 'test_or2d', 'test_pow',
    'test_prelu_broadcast', 'test_quantizelinear', 'test_range_bfloat16_type_positive_delta', 'test_reciprocal',
    'test_reduce_l1_default_axes_keepdims_example', 'test_reduce_l2_default_axes_keepdims_example', 'test_reduce_log_sum_asc_axes',
    'test_reduce_log_sum_exp_default_axes_keepdims_example', 'test_reduce_max_bool_inputs',
    'test_reduce_mean_default_axes_keepdims_example', 'test_reduce_min_bool_inputs',
    'test_reduce_prod_default_axes_keepdims_example', 'test_reduce_sum_default_axes_keepdims_example',
    'test_reduce_sum_square_default_axes_keepdims_example', 'test_relu', 'test_reshape_allowzero_reordered',
    'test_resize_downsample_scales_cubic', 'test_rms_normalization_2d_axis0', 'test_round', 'test_selu', 'test_shape',
    'test_shrink_hard', 'test_sigmoid', 'test_sign', 'test_sin', 'test_sinh', 'test_size', 'test_slice', 'test_softmax_axis_0',
    'test_softplus', 'test_softsign', 'test_spacetodepth', 'test_split_1d_uneven_split_opset18', 'test_sqrt', 'test_squeeze',
    'test_sub', 'test_sum_example', 'test_tan', 'test_tanh', 'test_thresholdedrelu', 'test_tile', 'test_top_k',
    'test_transpose_all_permutations_0', 'test_tril', 'test_unsqueeze_axis_0', 'test_upsample_nearest', 'test_where_example',
    'test_xor2d',
    'test_gru_batchwise', 'test_lstm_batchwise', 'test_rnn_seq_length',      # the recurrent operators (nac_lab.onnx.rnn)
]

REFUSED = {
    'test_constant_pad': 'node 0 (Pad): input 2 (a shape or index argument) is computed from input data',
    'test_onehot_negative_indices': 'node 0 (OneHot): input 1 (a shape or index argument) is computed from input data',
    'test_range_bfloat16_type_positive_delta': 'test data NAC cannot hold',
    'test_resize_downsample_scales_cubic': 'node 0 (Resize): cubic interpolation is not imported',
    'test_upsample_nearest': 'node 0 (Upsample): input 1 (a shape or index argument) is computed from input data',
}

_CASES = {}

def _case(name):
    if not _CASES: _CASES.update((c.name, c) for c in node_cases('^(' + '|'.join(SAMPLE) + ')$'))
    return _CASES[name]


@pytest.mark.parametrize('name', SAMPLE)
def test_onnx_operator_case(name):
    r = run_case(_case(name))
    if name in REFUSED: assert not r.ok and REFUSED[name] in r.why, r.why
    else: assert r.ok, r.why


def test_sample_covers_the_operators_and_counts():
    results = [run_case(_case(n)) for n in ('test_abs', 'test_constant_pad', 'test_relu')]
    assert op_table(results) == [('Abs', 1, 1), ('Pad', 0, 1), ('Relu', 1, 1)]
    assert len(SAMPLE) == 136 and len(set(SAMPLE)) == 136 and len(REFUSED) == 5
    print(f'ONNX operator cases: {len(SAMPLE) - len(REFUSED)} of {len(SAMPLE)} operators pass their first case')
