"""The four Trillim blobs of a tiny BitNet checkpoint with a LoRA adapter, shared by the Trillim file tests and fuzz suite.

Built from relative paths inside the given folder, so every byte (the manifest's shard table, every offset) is the
same whatever folder or path length pytest picks (--basetemp, xdist worker, ...)."""
import os
from nac_lab.trillim.config import load_hf_config
from nac_lab.trillim.manifest import tiny_checkpoint, tiny_adapter, build_manifest, write_manifest
from nac_lab.trillim.files import quantize

def tiny_trillim_blobs(folder, targets) -> dict:
    "`{'manifest', 'tensors', 'rope', 'lora'}` bytes of a 1-layer, 2-shard BitNet checkpoint with a rank-2 adapter on `targets`."
    old = os.getcwd(); os.chdir(folder)
    try:
        tiny_checkpoint('m', arch='bitnet', layers=1, vocab=64, max_pos=16, shards=2)
        tiny_adapter('a', 'm', r=2, targets=targets)
        cfg = load_hf_config('m')
        m = build_manifest('m', 'a', cfg)
        p = quantize(m, cfg, 'm')
        return {'manifest': write_manifest(m), **{k: p[k].read_bytes() for k in ('tensors', 'rope', 'lora')}}
    finally: os.chdir(old)
