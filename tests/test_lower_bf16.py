("bf16 float lowering (a device with bf16 but not f32 variants for every layer): bit-exact against the numpy bf16 reference (decision "
 "NEM E5).")
import warnings
import numpy as np, pytest
from nac_lab.nac.compiler.zoo import build_model, example_inputs
from nac_lab.nac.compiler.compile import compile as nac_compile
from nac_lab.lower.api import lower
from nac_lab.lower.reference import reference_bf16

@pytest.mark.parametrize('name,batch,tiling', [('mlp', 8, 'search'), ('cnn', 2, 'naive'), ('cnn', 2, 'search')])
def test_bf16_bit_exact(name, batch, tiling):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        ex = example_inputs(name, batch=batch, seed=3); m = nac_compile(build_model(name), ex)
    xs = [t.numpy() for t in ex]
    low = lower(m, 'npm_pro', mode='float', example=xs, tiling=tiling)
    assert low.elem == 'bf16' and not low.check().errors            # npm_pro: f32 gemm but no f32 eltwise, bf16 everywhere
    y = low.run(*xs)[0]
    ref = reference_bf16(low.graph, *xs)[low.graph.outputs[0]]
    np.testing.assert_array_equal(y, ref)
    yt = m.run(*ex)[0].numpy()
    assert np.abs(y - yt).max() < 0.02 * np.abs(yt).max()           # and bf16-close to the float32 model
