"""Gemma3Backbone step times on the Gemma 3 270M (make gemma; its blocks as stored, Q5_0 run as
Q8_0): forward (one mtp.decoder_layers(layer="gemma3") call per pass) against forward_ops (the
same kernels op by op, ~16 calls per layer), one-token and 4-token steps after a short
prompt, fp32 and bf16 activations; the two paths interleaved call by call so that both see the
same minutes of a shared machine; median of 40 after 5 warm-ups, 2 threads.

    .venv/bin/python bench/gemma3_step_times.py
"""

import statistics
import time

import torch

from mtp_kernels.models import gemma3
from mtp_kernels.models.gemma3_backbone import Gemma3Backbone

torch.set_num_threads(2)
cfg, native, tok = gemma3.load(native=True, widen=True)  # as the default load: Q5_0 widened into the arena
for dtype in (torch.float32, torch.bfloat16):
    model = Gemma3Backbone(cfg, native, dtype)
    ids = gemma3.prompt_ids(tok, cfg, "Once upon a time, in a small village by the sea, there lived")
    cache = model.new_cache(1, 256)
    model(torch.tensor([ids]), cache)
    base = cache.lens.clone()
    for T in (1, 4):
        tokens = torch.tensor([[100 + t for t in range(T)]])
        times = {"fused": [], "ops": []}
        for rep in range(45):
            for name, fwd in (("fused", model.forward), ("ops", model.forward_ops)):
                cache.lens.copy_(base)
                t0 = time.perf_counter()
                fwd(tokens, cache)
                times[name].append(time.perf_counter() - t0)
        f, o = (statistics.median(times[n][5:]) * 1e3 for n in ("fused", "ops"))
        print(f"{str(dtype):15s} T={T}: fused {f:.2f} ms, op by op {o:.2f} ms, saved {o - f:.2f} ms", flush=True)
