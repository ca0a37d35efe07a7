"""decision Trillim 5: the RoPE base comes from both HF config layouts through the one shared reader
(`nac_lab.config.rope_theta_field`), so Trillim's `--config` vector and `rope.cache` and IR v2's config agree."""
import json, math
import numpy as np
import pytest
from nac_lab.trillim.config import load_hf_config, config_args, ArchConfigError
from nac_lab.trillim.files import rope_bytes, read_rope
from nac_lab.irv2.build import read_config
from nac_lab.irv2.maps import ConfigError

BASE = dict(model_type='llama', architectures=['LlamaForCausalLM'], hidden_size=64, intermediate_size=128, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=32, max_position_embeddings=16, rms_norm_eps=1e-5,
            eos_token_id=2)
V4 = dict(BASE, rope_theta=500000.0)                                                    # transformers < 5
V5 = dict(BASE, rope_parameters={'rope_type': 'default', 'rope_theta': 500000})          # transformers >= 5

@pytest.mark.parametrize('cfg', [V4, V5], ids=['top-level', 'rope_parameters'])
def test_both_layouts_reach_config_vector_and_rope_cache(tmp_path, cfg):
    (tmp_path/'config.json').write_text(json.dumps(cfg))
    c = load_hf_config(tmp_path)
    assert c.rope_theta == 500000.0
    assert config_args(c)[11] == '500000.0'                  # §2 field 11: rope_theta
    rc = read_rope(rope_bytes(c))
    assert rc.theta == 500000.0
    # pair 1 of position 1: angle = 500000 ** (-2/16) (head_dim 16), computed here by hand, not by the writer
    assert math.isclose(float(rc.cos[1, 1]), math.cos(500000.0 ** (-2 / 16)), rel_tol=1e-6)
    assert np.float32(rc.sin[3, 0]) == np.float32(math.sin(3.0))
    assert read_config(cfg)['rope_theta'] == 500000.0         # IR v2 reads the same value through the same reader

def test_contradiction_named_by_both_paths(tmp_path):
    cfg = dict(V4, rope_parameters={'rope_theta': 10000.0})
    (tmp_path/'config.json').write_text(json.dumps(cfg))
    with pytest.raises(ArchConfigError, match=r'rope_theta=500000.0 and rope_parameters.rope_theta=10000.0'): load_hf_config(tmp_path)
    with pytest.raises(ConfigError, match=r'rope_theta=500000.0 and rope_parameters.rope_theta=10000.0'): read_config(cfg)

def test_default_only_when_neither_layout_has_it(tmp_path):
    (tmp_path/'config.json').write_text(json.dumps(BASE))
    assert load_hf_config(tmp_path).rope_theta == 10000.0 and read_config(BASE)['rope_theta'] == 10000.0

def test_cli_config_vector_and_verbose_sources(tmp_path):
    from nac_lab.cli import run_cli
    from nac_lab.trillim.manifest import tiny_checkpoint
    tiny_checkpoint(tmp_path / 'm', layers=1, vocab=100)
    c = json.loads((tmp_path / 'm' / 'config.json').read_text()); c.pop('rope_theta', None)
    c['rope_parameters'] = {'rope_type': 'default', 'rope_theta': 500000}
    (tmp_path / 'm' / 'config.json').write_text(json.dumps(c))
    rc, out, err = run_cli('trillim', 'config', tmp_path / 'm', '-v')
    assert rc == 0 and out.split()[11] == '500000.0'
    assert 'rope_theta = 500000.0 from rope_parameters.rope_theta' in err.splitlines()
