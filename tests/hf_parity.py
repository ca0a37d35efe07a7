"""Shared by the IR v2 parity tests: run a prompt and a greedy continuation through the generated C runtime and through
a transformers model, side by side, each through its own KV cache."""
import numpy as np
import torch


def prefill_and_decode(rt, model, prompt, steps, tol, min_scale=0.1):
    "Assert the runtime's logits equal the model's within `tol` for `prompt` and `steps` greedy tokens; same tokens."
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
    got = rt.prefill(prompt)
    assert np.abs(out.logits[0].numpy()).max() > min_scale          # real logits, not numbers near zero
    assert np.abs(got - out.logits[0].numpy()).max() < tol
    past, last, ours = out.past_key_values, out.logits[0, -1].numpy(), got[-1]
    for _ in range(steps):
        tok = int(np.argmax(last)); assert tok == int(np.argmax(ours))
        with torch.no_grad():
            out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past, last, ours = out.past_key_values, out.logits[0, -1].numpy(), rt.decode(tok)
        assert np.abs(ours - last).max() < tol
