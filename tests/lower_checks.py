"""One check shared by the lowering tests: a lowered int8 program executed bit-exactly equal to the whole-tensor integer reference."""
import numpy as np
from int_reference import reference_int8          # the independent integer reference, not the lowering's own

def assert_int8_bit_exact(low, shape, seeds) -> None:
    "Run `low` on seeded normal inputs of `shape` (one per seed) and require every output equal to `reference_int8` bit for bit."
    for seed in seeds:
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        raw = low.run_raw(*low.quantize_inputs(x).values())
        ref = reference_int8(low.graph, low.qp, low.ql, low.qp['x'].quantize(x))
        for o in low.graph.outputs:           # 4-D outputs are stored NHWC; others as they are
            np.testing.assert_array_equal(np.transpose(raw[o], (0, 3, 1, 2)) if raw[o].ndim == 4 else raw[o], ref[o])
