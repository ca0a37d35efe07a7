"""The lowering's one vocabulary (issue #29 item 5): every graph-stage `LayerOp` has exactly one emitter (or is the
view `emit_program` makes itself) and a reference computation in every mode its facts promise; registration refuses
a second emitter; the validity check runs inside `lower()`."""
import numpy as np
import pytest
import nac_lab.lower.api  # noqa: F401  (lower() and what it imports: every module that registers emitters)
from nac_lab.lower.layers import LayerOp, OP_FACTS, Layer, LayerGraph, LowerError
from nac_lab.lower.emit import LAYER_EMITTERS, VIEW_OPS, register_emitters
from nac_lab.lower.reference import FLOAT_REF, INT8_REF, BF16_REF, REAL_OVERRIDE, missing_references

GRAPH_OPS = sorted(o for o, f in OP_FACTS.items() if f.stage == 'graph')

def test_every_op_has_one_emitter():
    emitted = sorted(set(LAYER_EMITTERS) | set(VIEW_OPS))
    assert emitted == GRAPH_OPS, (sorted(set(GRAPH_OPS) - set(emitted)), sorted(set(emitted) - set(GRAPH_OPS)))
    assert not set(LAYER_EMITTERS) & set(VIEW_OPS)
    assert all(type(k) is LayerOp for k in LAYER_EMITTERS)

def test_every_op_has_its_references():
    m = missing_references()
    assert (m['float'], m['int8'], sorted(m['bf16'])) == ([], [], [o for o in GRAPH_OPS if not OP_FACTS[o].bf16])
    assert set(REAL_OVERRIDE) <= set(FLOAT_REF) and not set(REAL_OVERRIDE) & set(INT8_REF)
    # ops computed directly on the integers are exactly the requant / exact / island ones
    assert sorted(INT8_REF) == sorted(o for o in GRAPH_OPS if OP_FACTS[o].int8 != 'real')
    assert sorted(BF16_REF) == sorted(o for o in GRAPH_OPS if OP_FACTS[o].bf16)

def _emit_same(E, l, ctx, xv, yv, prev): return prev     # the registered relu emitter's name, defined in another module

def test_registration_refuses_a_second_emitter_and_unknown_ops():
    def other(E, l, ctx, xv, yv, prev): return prev
    with pytest.raises(LowerError, match='relu: a second emitter'): register_emitters(relu=other)
    assert _emit_same.__qualname__ == LAYER_EMITTERS[LayerOp.relu].__qualname__ and _emit_same.__module__ != 'nac_lab.lower.emit'
    with pytest.raises(LowerError, match='relu: a second emitter'): register_emitters(relu=_emit_same)
    with pytest.raises(LowerError, match='not an op that emission sees'): register_emitters(hardswish=other)
    with pytest.raises(ValueError): register_emitters(frobnicate=other)
    assert LAYER_EMITTERS[LayerOp.relu].__name__ == '_emit_same'

def test_lower_runs_the_validity_check(monkeypatch):
    import nac_lab.lower.api as api
    bad = LayerGraph({'x': (1, 4)}, [Layer('a', 'add', ['x', 'nowhere'], shape=(1, 4), nac=3)], ['a'])
    monkeypatch.setattr(api, 'import_nac', lambda m, *ex, **kw: bad)
    monkeypatch.setattr(api, 'signature_example', lambda m, b: (np.zeros((1, 4), np.float32),))
    import nac_lab.nac.runtime.run as run
    monkeypatch.setattr(run, 'load', lambda p: object())
    with pytest.raises(LowerError, match=r"a \(add, NAC instruction 3\): reads \['nowhere'\] before any layer or input defines it"):
        api.lower('model.nac', 'npm_pro')
