"""Optional extra: real `transformers` architectures built from small configs with random weights (no network).

Each is compiled with a dynamic batch dimension, saved, loaded and run at batch 1 and 4; the output must
match PyTorch eager within 1e-5. Skipped when `transformers` is not installed.
"""
import warnings
import pytest, torch
from torch.export import Dim

T = pytest.importorskip('transformers')
from nac_lab.nac.compiler.compile import compile as nac_compile, load

ATOL = 1e-5
_common = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=64)

ARCHS = {
    'bert': lambda: (T.BertModel(T.BertConfig(**_common)), 'last_hidden_state'),
    'gpt2': lambda: (T.GPT2LMHeadModel(T.GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                                    bos_token_id=0, eos_token_id=0, use_cache=False)), 'logits'),
    'llama': lambda: (T.LlamaForCausalLM(T.LlamaConfig(**_common, num_key_value_heads=2, use_cache=False)), 'logits'),
    'qwen2': lambda: (T.Qwen2ForCausalLM(T.Qwen2Config(**_common, num_key_value_heads=2, use_cache=False)), 'logits'),
    'mistral': lambda: (T.MistralForCausalLM(T.MistralConfig(**_common, num_key_value_heads=2, use_cache=False)), 'logits'),
    't5_encoder': lambda: (T.T5EncoderModel(T.T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                       num_heads=4)), 'last_hidden_state'),
}

class TokensToTensor(torch.nn.Module):
    "Call a HF model on `input_ids` and return one tensor of its output object."
    def __init__(self, model, attr):
        super().__init__(); self.model, self.attr = model, attr
    def forward(self, input_ids): return getattr(self.model(input_ids=input_ids), self.attr)

@pytest.mark.parametrize('arch', list(ARCHS))
def test_transformers_arch(arch, tmp_path):
    torch.manual_seed(0)
    hf, attr = ARCHS[arch]()
    m = TokensToTensor(hf.eval(), attr).eval()
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        nm = nac_compile(m, (torch.randint(0, 128, (2, 8), generator=g),), dynamic_shapes=({0: Dim.AUTO},))
    loaded = load(nm.save(tmp_path / f'{arch}.nac'))
    for b in (1, 4):
        x = torch.randint(0, 128, (b, 8), generator=g)
        with torch.no_grad(): ref = m(x)
        out = loaded.run(x)[0]
        assert out.shape == ref.shape
        diff = float((out - ref).abs().max())
        assert diff <= ATOL, f'{arch} batch {b}: max abs diff {diff:.3e}'
    assert torch.equal(loaded.run(x)[0], out)
