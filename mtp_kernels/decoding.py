"""Greedy and speculative (frozen-MTP) generation, batch >= 1, bit-exact to each other.

Speculative step, per request b: the head drafts K tokens after the backbone's pending
token t0; the backbone runs [t0, d1..dK] in one pass (K+1 positions); `mtp.verify`
accepts the longest prefix equal to the backbone's own greedy choices and adds the
backbone's token at the first mismatch (or the bonus token after a full match). The cache
keeps t0 and the accepted drafts: its length is set back past the rejected ones.

Tree drafts (branches=M > 1, greedy): the pass also verifies the head's 2nd..M-th best first
drafts, each a leaf beside the chain (mtp.decoder_layers with tree_parents: every token gets
the bits a chain of its path would). When the chain's first draft is wrong and one of them is
the backbone's token, it is accepted with its own next token, and its K/V moves into the
place after t0.

Prompt lookup (lookup=N): where the request's last tokens occurred before in its prompt or
output, the up to N tokens that followed them there are the drafts instead (proofreading and
summaries copy their input), fewer where the match is short (lookup_start); the head drafts
elsewhere. Any drafts keep the output exact.

The head's chain stops where it is unsure (draft_confidence=P): before its first draft whose
probability under the head, times its earlier drafts', is below P (confident_drafts); a
request left with no drafts takes a one-token pass. Fewer drafts keep the output exact too.

With temperature > 0 both paths sample through `mtp.verify_sampled`, whose RNG is keyed by
(request seed, absolute position): plain sampling draws each token as the bonus of a
zero-draft verify, and speculative sampling accepts a (greedy, one-hot) draft iff it equals
the token drawn at that position with that key. So for the same seed the two paths give the
same tokens (the verify pass's logits are bitwise those of one-token steps).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Optional

import torch

from . import reference
from .config import DecodeConfig, gives_draft_probs, is_mtp_head
from .models.head import MTPHead
from .models.llama import Backbone, KVCache


def cut_at_eos(tokens: list[int], eos) -> list[int]:
    """The tokens up to and including the first EOS."""
    for i, tok in enumerate(tokens):
        if tok in eos:
            return tokens[: i + 1]
    return tokens


@dataclasses.dataclass
class Generation:
    tokens: list[int]  # generated ids (ending with EOS when one was produced)
    passes: int = 0  # backbone forward passes after the prefill while it was running
    seconds: float = 0.0  # decode time (prefill and loading excluded)
    prefill_seconds: float = 0.0
    drafted: list[int] = dataclasses.field(default_factory=list)  # drafts offered at position j
    accepted: list[int] = dataclasses.field(default_factory=list)  # drafts accepted at position j
    leaves_accepted: int = 0  # tree passes whose first accepted draft was a leaf, not the chain's

    @property
    def tokens_per_pass(self) -> float:
        """tau: tokens committed per backbone pass (the first token comes from the prefill)."""
        return (len(self.tokens) - 1) / self.passes if self.passes else 0.0


LOOKUP_NGRAMS = (3, 2)  # the context suffixes searched for, longest first (1 token matches too often)


def lookup_drafts(context: list[int], max_drafts: int, start: Optional[int] = None) -> list[int]:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the context's
    last n tokens (n in LOOKUP_NGRAMS, longest first); [] when none occurs. A match offers
    `start` tokens (None: max_drafts), one more per token it also matches before those n (a
    longer copy is likelier to go on), at most max_drafts."""
    if max_drafts < 1:
        return []
    start = max_drafts if start is None else min(start, max_drafts)
    L = len(context)
    for n in LOOKUP_NGRAMS:
        if L <= n:
            continue
        pattern = context[-n:]
        for s in range(L - n - 1, -1, -1):  # s + n < L: one token follows
            if context[s : s + n] == pattern:
                more = 0  # how far the match extends before the n tokens (no further than it can use)
                while start + more < max_drafts and more < s and context[s - 1 - more] == context[L - n - 1 - more]:
                    more += 1
                return context[s + n : s + n + start + more]
    return []


def confident_drafts(drafts: list[int], probs: list[float], confidence: float) -> list[int]:
    """The leading drafts whose cumulative probability (the product of theirs and their
    earlier drafts' probabilities under the head, mtp.head_draft's probs_out) is at least
    `confidence` (a NaN one is not)."""
    keep, p = 0, 1.0
    for q in probs[: len(drafts)]:
        p *= q
        if not p >= confidence:
            break
        keep += 1
    return drafts[:keep]


def request_seeds(seed: int, batch: int) -> torch.Tensor:
    """Request b's RNG seed: mix64(mix64(seed) + b) as int64 (one stream per request)."""
    mask = (1 << 64) - 1
    vals = [reference.mix64((reference.mix64(seed & mask) + b) & mask) for b in range(batch)]
    return torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in vals], dtype=torch.long)


class _Sampler:
    """The token at absolute position `positions[b]` from logits [B, V]: argmax when
    temperature is 0, else drawn with the counter-based RNG of mtp.verify_sampled."""

    def __init__(self, batch: int, temperature: float, seed: int, lenient: Optional[tuple[int, float]] = None):
        if not (temperature >= 0 and temperature != float("inf")):
            raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
        if lenient is not None and temperature != 0:
            raise ValueError("lenient verification is a greedy mode: it needs temperature 0")
        self.greedy = temperature == 0
        self.lenient = lenient
        self.temp = torch.full((batch,), float(temperature))
        self.seeds = request_seeds(seed, batch)
        self.no_drafts = torch.empty(batch, 0, dtype=torch.long)

    def __call__(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.greedy:  # verify with no drafts: argmax by mtp.verify's kernel (torch.argmax's rules)
            return torch.ops.mtp.verify(self.no_drafts, logits[:, None])[1][:, 0]
        _, out = torch.ops.mtp.verify_sampled(
            self.no_drafts, None, logits[:, None], self.temp, self.seeds, positions.long()
        )
        return out[:, 0]

    def verify(self, drafts, logits, num, positions):
        if self.lenient is not None:
            return torch.ops.mtp.verify_lenient(drafts, logits, num, *self.lenient)
        if self.greedy:
            return torch.ops.mtp.verify(drafts, logits, num)
        return torch.ops.mtp.verify_sampled(drafts, None, logits, self.temp, self.seeds, positions.long(), num)


def _prefill(
    model: Backbone, cache: KVCache, prompts: list[list[int]], pick: _Sampler, taps: tuple[int, ...] = ()
) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs each prompt into its own cache row; returns the features of the last positions
    [B, 1 + len(taps), H] (Backbone.features) and the first generated tokens [B]."""
    hidden, feats = [], []
    for b, ids in enumerate(prompts):
        if not ids:
            raise ValueError(f"prompt {b} is empty")
        h, f = model.features(torch.tensor([ids]), cache.select(b), layers=taps)
        hidden.append(h[0, -1])
        feats.append(f[0, -1])
    # The new token's index: the prompt length.
    return torch.stack(feats), pick(model.logits(torch.stack(hidden)), cache.lens)


def _check_prompts(model: Backbone, prompts: list[list[int]], max_new_tokens: int, extra: int) -> int:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    need = max(len(p) for p in prompts) + max_new_tokens + extra
    if need > model.cfg.max_position:
        raise ValueError(
            f"the longest prompt ({max(len(p) for p in prompts)} tokens) plus max_new_tokens "
            f"({max_new_tokens}) does not fit the model's context of {model.cfg.max_position} tokens"
        )
    return need


def tree_parents(B: int, chain: int, leaves: int) -> torch.Tensor:
    """[B, 1 + chain + leaves]: row 0 the root, rows 1..chain a chain from it, then `leaves`
    children of the root."""
    row = [-1] + list(range(chain)) + [0] * leaves
    return torch.tensor([row] * B)


def generate(
    model: Backbone,
    prompts: list[list[int]],
    max_new_tokens: int,
    head: Optional[MTPHead] = None,
    k: Optional[int] = None,
    eos_token_ids: tuple[int, ...] = (),
    on_tokens: Optional[Callable[[int, list[int]], None]] = None,
    temperature: float = 0.0,
    seed: int = 0,
    lenient: Optional[tuple[int, float]] = None,
    lookup: Optional[int] = None,
    branches: Optional[int] = None,
    lookup_start: Optional[int] = None,
    draft_confidence: Optional[float] = None,
) -> list[Generation]:
    """Greedy generation of every prompt (token id lists); speculative with `head` and K
    drafts per pass when a head is given (an MTPHead, or any drafter with its `draft`;
    one with `begin(prompts, capacity)` gets it right after the backbone's prefill, timed
    into prefill_seconds: a standalone drafter's own prefill). on_tokens(b, ids) sees each
    request's newly committed tokens as they come (for streaming). temperature > 0 samples (lossless
    rejection sampling with a head), keyed by (seed, request index, position).
    lenient=(top_k, min_ratio) verifies drafts with mtp.verify_lenient (greedy only, with a
    head): NOT lossless, the output may differ from greedy decoding; (1, x) is exact.
    lookup=N > 0 drafts up to N tokens by prompt lookup (lookup_drafts) where the context
    repeats itself, the head (if any) elsewhere; exact like any drafts; lookup_start=S: a match
    no longer than the searched suffix offers S of them, one more per token it matches before.
    draft_confidence=P in [0, 1] (an MTP head's chain): the chain stops before its first draft
    whose cumulative probability under the head is below P (0: every draft verified).
    branches=M > 1 (greedy, an MTP head) verifies the head's M best first drafts in each of its
    passes: its chain of k and M - 1 leaves (see the module's docstring). k, lookup and branches left None take the
    defaults of `mtp generate` for this backbone and drafter (config.DecodeConfig.resolve), as
    do lookup_start and draft_confidence; with k, branches and draft_confidence left None,
    sampling at a temperature where the head's drafts do not pay (config.head_drafts_pay)
    decodes without the head (prompt lookup alone)."""
    if head is not None and k is not None and k < 1:
        raise ValueError(f"k (drafts per pass) must be >= 1, got {k}")
    config = DecodeConfig.resolve(
        model,
        head,
        k=k,
        branches=branches,
        lookup=lookup,
        lookup_start=lookup_start,
        draft_confidence=draft_confidence,
        temperature=temperature,
        seed=seed,
        lenient=lenient,
    )
    head = head if config.k else None  # resolved to lookup alone (config.head_drafts_pay)
    _check_config(head, config)
    return _Decoding(model, head, config, prompts, max_new_tokens, eos_token_ids, on_tokens).run()


def _check_config(head, config: DecodeConfig) -> None:
    if config.branches < 1:
        raise ValueError(f"branches (first drafts per head pass) must be >= 1, got {config.branches}")
    if config.branches > 1 and (not is_mtp_head(head) or config.temperature != 0 or config.lenient is not None):
        raise ValueError(
            "branches > 1 (tree drafts) needs the MTP head and greedy verification (temperature 0, not lenient)"
        )
    if config.lookup < 0:
        raise ValueError(f"lookup (most drafts by prompt lookup) must be >= 0, got {config.lookup}")
    if config.lookup and config.lookup_start < 1:
        raise ValueError(f"lookup_start (drafts of a short lookup match) must be >= 1, got {config.lookup_start}")
    if not 0 <= config.draft_confidence <= 1:
        raise ValueError(f"draft_confidence (a probability) must be in [0, 1], got {config.draft_confidence}")
    if config.draft_confidence and (not gives_draft_probs(head) or config.branches > 1):
        raise ValueError(
            "draft_confidence cuts the MTP head's chain: it needs a head whose draft gives its probabilities "
            "(MTPHead) and branches = 1"
        )
    if config.lookup and hasattr(head, "begin"):
        raise ValueError(
            "lookup drafts go with the MTP head or alone: a standalone drafter's own cache assumes "
            "every committed token was its own draft"
        )


class _Decoding:
    """One generate call: `prefill`, then one `step` per backbone pass until every request is
    done; a step is a plain pass, or `propose` (drafts), `verify` (one pass over them) and
    `accept` (cache, stats, tokens)."""

    def __init__(
        self,
        model: Backbone,
        head,
        config: DecodeConfig,
        prompts: list[list[int]],
        max_new_tokens: int,
        eos_token_ids,
        on_tokens,
    ):
        self.model, self.head, self.prompts, self.max_new_tokens = model, head, prompts, max_new_tokens
        self.on_tokens, self.lookup, self.lookup_start = on_tokens, config.lookup, config.lookup_start
        self.confidence = config.draft_confidence
        self.K = config.k if head is not None else 0
        self.A = config.branches - 1  # the leaves beside the head's chain
        self.width = max(self.K, config.lookup)  # the longest chain one pass verifies
        self.B = B = len(prompts)
        self.pick = _Sampler(B, config.temperature, config.seed, config.lenient)
        self.cache = model.new_cache(B, _check_prompts(model, prompts, max_new_tokens, self.width + self.A + 1))
        self.eos = set(eos_token_ids)
        self.out = [Generation(tokens=[], drafted=[0] * self.width, accepted=[0] * self.width) for _ in range(B)]
        self.done = [False] * B
        # The backbone layers whose residual streams an MTP head fuses into its input (HeadConfig).
        self.taps = tuple(getattr(getattr(head, "cfg", None), "fuse_layers", ()))
        # each request's last features [B, 1 + len(taps), H] (Backbone.features) and pending token [B]
        self.hidden = self.token = None

    def run(self) -> list[Generation]:
        t0 = time.perf_counter()
        self.prefill()
        t1 = time.perf_counter()
        while not all(self.done):
            self.step()
        t2 = time.perf_counter()
        for g in self.out:
            g.seconds, g.prefill_seconds = t2 - t1, t1 - t0
        return self.out

    def prefill(self) -> None:
        """The prompts into the cache, the first token of each request (and the standalone
        drafter's own prefill)."""
        self.hidden, self.token = _prefill(self.model, self.cache, self.prompts, self.pick, self.taps)
        if hasattr(self.head, "begin"):
            self.head.begin(self.prompts, self.cache.capacity)
        for b in range(self.B):
            self.commit(b, [int(self.token[b])])

    def commit(self, b: int, ids: list[int]) -> None:
        """Appends request b's new tokens (cut at max_new_tokens and the first EOS)."""
        out = self.out[b]
        ids = cut_at_eos(ids[: self.max_new_tokens - len(out.tokens)], self.eos)
        out.tokens.extend(ids)
        self.done[b] = len(out.tokens) >= self.max_new_tokens or (bool(ids) and ids[-1] in self.eos)
        if self.on_tokens and ids:
            self.on_tokens(b, ids)

    def step(self) -> None:
        """One backbone pass for every request still running."""
        active = torch.tensor([not d for d in self.done])
        for b in range(self.B):
            self.out[b].passes += not self.done[b]
        start = self.cache.lens.clone()
        if self.width == 0:
            self.plain_step(active, start)
            return
        drafts, num, leaves = self.propose()
        feats, logits, accepted, tokens = self.verify(drafts, num, leaves, start)
        self.accept(active, start, drafts.shape[1], num, leaves, feats, logits, accepted, tokens)

    def plain_step(self, active: torch.Tensor, start: torch.Tensor) -> None:
        """One token per request, no drafts."""
        hidden = self.model(self.token[:, None], self.cache)[:, 0]
        self.cache.truncate(torch.where(active, self.cache.lens, start))  # finished requests stay put
        self.hidden, self.token = hidden[:, None], self.pick(self.model.logits(hidden), start + 1)
        for b in range(self.B):
            if not self.done[b]:
                self.commit(b, [int(self.token[b])])

    def propose(self) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
        """Drafts [B, W], how many of each request's to verify (none past max_new_tokens) and
        each request's other first drafts (tree leaves; [] for lookup drafts)."""
        B, out, done = self.B, self.out, self.done
        found = [
            lookup_drafts(self.prompts[b] + out[b].tokens, self.lookup, self.lookup_start)
            if self.lookup and not done[b]
            else []
            for b in range(B)
        ]
        rows, leaves = found, [[] for _ in range(B)]
        if self.head is not None and not all(found[b] or done[b] for b in range(B)):
            if self.A:
                drafted = self.head.draft(self.model, self.cache, self.hidden, self.token, self.K, self.A).tolist()
            elif self.confidence:
                probs = torch.empty(B, self.K, device=self.hidden.device)
                drafted = self.head.draft(self.model, self.cache, self.hidden, self.token, self.K, probs_out=probs)
                drafted = [confident_drafts(d, p, self.confidence) for d, p in zip(drafted.tolist(), probs.tolist())]
            else:
                drafted = self.head.draft(self.model, self.cache, self.hidden, self.token, self.K).tolist()
            rows = [f or d[: self.K] for f, d in zip(found, drafted)]
            leaves = [[] if f else d[self.K :] for f, d in zip(found, drafted)]
        num = [0 if done[b] else min(len(rows[b]), self.max_new_tokens - len(out[b].tokens) - 1) for b in range(B)]
        W = max(num)
        leaves = [leaves[b] if num[b] else [] for b in range(B)]
        return (
            torch.tensor([r[:W] + [0] * (W - len(r[:W])) for r in rows], dtype=torch.long).view(B, W),
            torch.tensor(num),
            leaves,
        )

    def verify(self, drafts: torch.Tensor, num: torch.Tensor, leaves: list[list[int]], start: torch.Tensor):
        """One backbone pass over [t0, chain, leaves] (a tree when there are leaves): its
        features (Backbone.features) and logits, and the verify op's accepted counts and tokens over the chain."""
        W, leaf_count = drafts.shape[1], max(map(len, leaves))
        parts = [self.token[:, None], drafts]
        if leaf_count:  # a tree: the chain, then the leaves (children of t0)
            parts.append(torch.tensor([ls + [0] * (leaf_count - len(ls)) for ls in leaves], dtype=torch.long))
        parents = tree_parents(self.B, W, leaf_count) if leaf_count else None
        h, feats = self.model.features(torch.cat(parts, dim=1), self.cache, parents, self.taps)
        logits = self.model.logits(h)
        accepted, tokens = self.pick.verify(drafts, logits[:, : W + 1], num, start + 1)
        return feats, logits, accepted, tokens

    def accept(self, active, start, W, num, leaves, feats, logits, accepted, tokens) -> None:
        """Keeps t0 and the accepted drafts in the cache (the rejected ones dropped by length,
        an accepted leaf moved after t0), counts the drafts and commits the tokens."""
        B, cache = self.B, self.cache
        cache.truncate(torch.where(active, start + 1 + accepted, start))
        self.hidden = feats[torch.arange(B), accepted]
        self.token = tokens[torch.arange(B), accepted]
        # A leaf that is the backbone's token (the chain's first draft was not): its row
        # (0: none) is accepted with its own next token, and its K/V moves after t0.
        leaf_row = [
            1 + W + leaves[b].index(int(tokens[b, 0]))
            if not self.done[b] and int(accepted[b]) == 0 and int(tokens[b, 0]) in leaves[b]
            else 0
            for b in range(B)
        ]
        after_leaf = self.pick(logits[torch.arange(B), leaf_row], start + 2) if any(leaf_row) else None
        for b in range(B):
            if self.done[b]:
                continue
            out, n = self.out[b], int(accepted[b])
            committed = tokens[b, : n + 1].tolist()
            if leaf_row[b]:
                row, s = leaf_row[b], int(start[b])
                cache.move(b, s + row, s + 1)
                n, self.hidden[b], self.token[b] = 1, feats[b, row], after_leaf[b]
                out.leaves_accepted += 1
                committed.append(int(self.token[b]))
            for j in range(int(num[b])):
                out.drafted[j] += 1
                out.accepted[j] += j < n
            self.commit(b, committed)
