"""The Gemma 3 head's draft vocabulary, chosen by measurement on the TRAINING data (never on
bench/gemma3_continuations.jsonl): for each size N, the share of the validation answers'
tokens (the first 4% of the distilled prompts, train.split) that the N most frequent tokens of
the training answers cover (a draft outside the vocabulary can never be right), beside the time
of one mtp.head_draft call (K = 3, a head of the shipped shape) reading N rows of the 262,144-row
LM head, and of one backbone step (the price of a pass the drafts must beat). 2 threads,
medians of 30 calls interleaved.

    .venv/bin/python bench/gemma3_draft_vocab.py runs/gemma3/distilled.jsonl
"""

import statistics
import sys
import time

import torch

from mtp_kernels import data, train
from mtp_kernels.models import gemma3, loading
from mtp_kernels.models.head import HeadConfig, MTPHead

torch.set_num_threads(2)
rows = data.read_jsonl(sys.argv[1])
train_rows, val_rows = train.split(rows)
cfg, model, tok, _ = loading.load_backbone(gemma3.default_gguf_path(), None, print)
sizes = (1024, 2048, 4096, 8192, 16384, 32768, cfg.vocab_size)
order = train.draft_vocabulary([r["answer_ids"] for r in train_rows], cfg.vocab_size, cfg.vocab_size, cfg.eos_token_ids)
rank = torch.empty(cfg.vocab_size, dtype=torch.long)
rank[order] = torch.arange(cfg.vocab_size)
val = torch.tensor([t for r in val_rows for t in r["answer_ids"]])
ids = gemma3.prompt_ids(tok, cfg, "Hi Sam, thanks for the notes on the budget. I read them twice and I think we")
cache = model.new_cache(1, 128)
h = model(torch.tensor([ids]), cache)[:, -1]
token = model.logits(h).argmax(-1)
heads = {}
for n in sizes:
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(cfg, kv_layer=-1, draft_vocab_size=0 if n == cfg.vocab_size else n))
    if n < cfg.vocab_size:
        head.set_draft_vocab(order[:n])
    heads[n] = head.to(model.dtype)
times = {n: [] for n in (*sizes, "step")}
for _ in range(30):
    for n in sizes:
        t0 = time.perf_counter()
        heads[n].draft(model, cache, h, token, 3)
        times[n].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    model(token[:, None], cache)
    times["step"].append(time.perf_counter() - t0)
    cache.lens.sub_(1)
print(
    f"{len(train_rows)} training answers, {val.numel()} validation answer tokens; backbone step "
    f"{statistics.median(times['step']) * 1e3:.2f} ms (layers only, no LM head)"
)
print("| draft vocabulary | validation tokens covered | head_draft, K = 3 |")
print("|---:|---:|---:|")
for n in sizes:
    cover = (rank[val] < n).float().mean().item()
    print(f"| {n:,} | {cover:.1%} | {statistics.median(times[n]) * 1e3:.2f} ms |")
