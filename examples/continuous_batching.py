"""Continuous batching over the runtime, verified with `torch.ops.mtp.verify_ragged`.

Requests arrive over time and take one of a fixed number of KV-cache slots; they leave (and
free their slot) when done. Every pass carries a different number of drafts per request (here
prompt-lookup drafts, capped by a budget that changes from pass to pass and request to
request), the backbone's rows of all requests form one flat [N + B, V] block, and one
`verify_ragged` call verifies the whole step: no padding of drafts or logits. At the end every
request's output is checked against decoding it alone (plain greedy, `decoding.generate`).

    .venv/bin/python examples/continuous_batching.py

The runtime's Backbone runs rectangular batches, so the pass here runs request by request (each
[pending token, drafts] into its own cache slot) and the rows are concatenated; in an engine
whose forward is itself flattened (vLLM v1) the logits come out in this layout directly.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

import mtp_kernels  # noqa: F401  (registers torch.ops.mtp.*)
from mtp_kernels.decoding import cut_at_eos, generate, lookup_drafts
from mtp_kernels.models.llama import Backbone

Drafter = Callable[["Request", int], list]  # (request, budget) -> up to `budget` draft ids


@dataclasses.dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    arrival: int = 0  # the pass at which it joins
    tokens: list[int] = dataclasses.field(default_factory=list)  # generated so far
    slot: int = -1
    pending: int = -1  # the backbone's latest token, not yet in the cache
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    done: bool = False


def lookup_drafter(r: Request, budget: int) -> list[int]:
    """Prompt-lookup drafts (the runtime's `lookup_drafts`) over the request's context."""
    return lookup_drafts(r.prompt + r.tokens, budget) if budget else []


def varying_budget(step: int, r: Request, max_drafts: int) -> int:
    """How many drafts request r may carry in pass `step`: different per pass and request."""
    return (step + 3 * r.rid) % (max_drafts + 1)


def serve(
    model: Backbone,
    requests: list[Request],
    slots: int,
    max_drafts: int = 4,
    drafter: Drafter = lookup_drafter,
    eos_token_ids: tuple[int, ...] = (),
    budget: Callable[[int, Request, int], int] = varying_budget,
    on_step: Optional[Callable[[int, list[Request], list[int]], None]] = None,
) -> list[Request]:
    """Runs every request to its end with at most `slots` in flight. on_step(step, running,
    counts) sees each verify step's requests and their draft counts."""
    capacity = max(len(r.prompt) + r.max_new_tokens for r in requests) + max_drafts + 1
    cache = model.new_cache(slots, capacity)
    free = list(range(slots))
    waiting = sorted(requests, key=lambda r: (r.arrival, r.rid))
    running: list[Request] = []
    eos = set(eos_token_ids)

    def commit(r: Request, ids: list[int]) -> None:
        ids = cut_at_eos(ids[: r.max_new_tokens - len(r.tokens)], eos)
        r.tokens.extend(ids)
        r.done = len(r.tokens) >= r.max_new_tokens or (bool(ids) and ids[-1] in eos)

    def verify(drafts: list[list[int]], rows: list[torch.Tensor]) -> tuple[list[int], list[list[int]]]:
        """One verify_ragged call over the flattened step: drafts [N], cu [B], logits [N + B, V]."""
        draft_ids = torch.tensor([t for d in drafts for t in d], dtype=torch.long)
        cu = torch.tensor([len(d) for d in drafts], dtype=torch.long).cumsum(0)
        accepted, out = torch.ops.mtp.verify_ragged(draft_ids, cu, torch.cat(rows))
        return accepted.tolist(), out.tolist()

    step = 0
    while waiting or running:
        # Join: arrived requests take free slots; their prefill's last row gives the first token
        # (a zero-draft verify_ragged: the same argmax rule as every other token).
        joined = []
        while waiting and waiting[0].arrival <= step and free:
            r = waiting.pop(0)
            r.slot = free.pop(0)
            cache.lens[r.slot] = 0
            h = model(torch.tensor([r.prompt]), cache.select(r.slot))
            joined.append((r, model.logits(h[0, -1:])))
        if joined:
            _, out = verify([[] for _ in joined], [row for _, row in joined])
            for (r, _), tokens in zip(joined, out):
                r.pending = tokens[0]
                commit(r, [r.pending])
                (free.append(r.slot) if r.done else running.append(r))
        if not running:
            step += 1
            continue

        # One pass: each request's [pending token, its drafts] at its own cache length.
        drafts, rows, starts = [], [], []
        for r in running:
            room = r.max_new_tokens - len(r.tokens) - 1  # no draft past max_new_tokens
            d = drafter(r, min(budget(step, r, max_drafts), room))[: max(room, 0)]
            starts.append(int(cache.lens[r.slot]))
            h = model(torch.tensor([[r.pending] + d]), cache.select(r.slot))
            rows.append(model.logits(h[0]))  # K_b + 1 rows
            drafts.append(d)
        if on_step:
            on_step(step, running, [len(d) for d in drafts])
        accepted, out = verify(drafts, rows)

        # Keep the pending token and the accepted drafts in the cache; commit; leave when done.
        still = []
        for r, d, n, tokens, start in zip(running, drafts, accepted, out, starts):
            cache.lens[r.slot] = start + 1 + n
            r.passes += 1
            r.drafted += len(d)
            r.accepted += n
            r.pending = tokens[n]
            commit(r, tokens[: n + 1])
            (free.append(r.slot) if r.done else still.append(r))
        running = still
        step += 1
    return requests


def alone(model: Backbone, r: Request, eos_token_ids: tuple[int, ...] = ()) -> list[int]:
    """The request decoded by itself: plain greedy generation of the runtime."""
    return generate(model, [r.prompt], r.max_new_tokens, eos_token_ids=eos_token_ids)[0].tokens


def tiny_random_model(seed: int = 0) -> Backbone:
    """A small random-weight Llama (the test suite's kind), so the example runs anywhere."""
    from mtp_kernels.models.checkpoint import expected_shapes
    from mtp_kernels.models.config import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0, max_position=256, tie_embeddings=True,
        eos_token_ids=(3,),
    )  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    weights = {
        name: torch.randn(shape, generator=g) * (0.5 if len(shape) == 1 else shape[-1] ** -0.5)
        + (1.0 if len(shape) == 1 else 0.0)
        for name, shape in expected_shapes(cfg).items()
    }
    return Backbone(cfg, weights, torch.float32)


def main() -> None:
    model = tiny_random_model()
    gen = torch.Generator().manual_seed(1)
    requests = [
        Request(
            rid=i,
            prompt=torch.randint(4, 97, (int(torch.randint(3, 20, (1,), generator=gen)),), generator=gen).tolist(),
            max_new_tokens=int(torch.randint(5, 40, (1,), generator=gen)),
            arrival=int(torch.randint(0, 30, (1,), generator=gen)),
        )
        for i in range(12)
    ]
    counts_seen = []
    serve(model, requests, slots=4, max_drafts=6, on_step=lambda s, run, counts: counts_seen.append(counts))
    for r in requests:
        assert r.tokens == alone(model, r), f"request {r.rid} differs from decoding it alone"
    steps = len(counts_seen)
    ragged = sum(len(set(c)) > 1 for c in counts_seen)
    print(f"{len(requests)} requests through 4 slots in {steps} verify steps ({ragged} with uneven draft counts)")
    for r in requests:
        print(
            f"  request {r.rid:2d}: arrived at pass {r.arrival:2d}, {len(r.tokens):2d} tokens in {r.passes:2d} passes, "
            f"{r.accepted}/{r.drafted} drafts accepted"
        )
    print("every request's output equals decoding it alone")


if __name__ == "__main__":
    main()
