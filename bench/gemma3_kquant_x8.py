"""The K-quants' x8 layout on the Gemma 3 270M (make gemma): Gemma3Backbone step times with its
Q4_K / Q6_K matrices (o_proj, down_proj) in the x8 layout, as the loader gives them, against
the same matrices in the file's layout (copies unpacked from the x8 groups); everything else
identical. One-token and 4-token steps (the layers and the LM head) after a short prompt, the
two models interleaved call by call so that both see the same minutes of a shared machine;
median of 40 after 5 warm-ups, 2 threads. Also checks that both give the same logits, bitwise.

    .venv/bin/python bench/gemma3_kquant_x8.py
"""

import statistics
import time

import torch

from mtp_kernels.gguf import QuantTensor, type_name
from mtp_kernels.models import gemma3
from mtp_kernels.models.gemma3_backbone import Gemma3Backbone

torch.set_num_threads(2)
cfg, native, tok = gemma3.load(native=True)
x8_kquants = ("Q4_K_X8", "Q6_K_X8")
kquants = {n: w for n, w in native.items() if isinstance(w, QuantTensor) and type_name(w.gguf_type) in x8_kquants}
file_layout = {**native, **{n: w.rows(slice(None)) for n, w in kquants.items()}}
mb = sum(w.nbytes for w in kquants.values()) / 1e6
print(f"{len(kquants)} K-quant matrices, {mb:.1f} MB: x8 layout against the file's", flush=True)
models = {"x8": Gemma3Backbone(cfg, native), "file": Gemma3Backbone(cfg, file_layout)}
ids = gemma3.prompt_ids(tok, cfg, "Once upon a time, in a small village by the sea, there lived")
caches = {n: m.new_cache(1, 256) for n, m in models.items()}
for n, m in models.items():
    m(torch.tensor([ids]), caches[n])
base = caches["x8"].lens.clone()
for T in (1, 4):
    tokens = torch.tensor([[100 + t for t in range(T)]])
    times = {n: [] for n in models}
    outs = {}
    for rep in range(45):
        for n, m in models.items():
            caches[n].lens.copy_(base)
            t0 = time.perf_counter()
            outs[n] = m.logits(m(tokens, caches[n]))
            times[n].append(time.perf_counter() - t0)
    assert torch.equal(outs["x8"], outs["file"]), "the layouts' logits differ"
    x8, f = (statistics.median(times[n][5:]) * 1e3 for n in ("x8", "file"))
    print(f"T={T}: x8 {x8:.2f} ms, file layout {f:.2f} ms a step ({f / x8:.2f}x), logits bitwise equal", flush=True)
