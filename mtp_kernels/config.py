"""The decoding defaults, in one place for the library and the CLI: `decoding.generate(...)`
and `mtp generate` given the same backbone, drafter and mode resolve the same configuration.

The values are measured (bench/RESULTS.md). Where a pass of up to 7 rows costs about a
one-token step (bf16 activations over float weights, the backbone dequantized on request):
prompt lookup of up to 6 tokens beside the MTP head ("Prompt lookup beside the head"), and
trees of the head's chain of 3 and its 3 best first drafts (greedy; "Tree drafts"). Over a
GGUF's own weights each row of a pass costs ~20% of a step (int8 dot products, compute-bound
past one row): chains of 2, and a lookup match offers 3 drafts, one more per token it also
matches before the searched suffix, up to 8 ("Shorter prompt lookup over the file's own weights",
"Prompt lookup that grows with its match"), and the head's chain stops before a draft it
is unsure of ("The head's chain cut where it is unsure"); sampling there at a temperature of 0.5
or more drafts by prompt lookup alone unless the head is asked for ("Drafts when sampling").
"""

from __future__ import annotations

import dataclasses
import inspect

import torch

# Most prompt-lookup drafts per pass beside the MTP head: where wide passes pay, else.
WIDE_LOOKUP, NARROW_LOOKUP = 6, 8
# Where passes are narrow, the drafts of a match no longer than the searched suffix (more for a
# longer match: decoding.lookup_drafts); where they are wide, every match offers the most.
NARROW_LOOKUP_START = 3
TREE_K, TREE_BRANCHES, CHAIN_K = 3, 3, 2
# Where passes are narrow, the MTP head's chain stops before its first draft whose probability
# under the head, times its earlier drafts', is below this (decoding.confident_drafts): the row
# costs more than the draft is worth.
NARROW_DRAFT_CONFIDENCE = 0.4
# Where passes are narrow, sampling at this temperature or above leaves the MTP head out unless
# asked (prompt lookup alone): the backbone's draws match its drafts too rarely for the draft and
# its rows to pay ("Drafts when sampling").
NARROW_SAMPLING_LOOKUP_ALONE_FROM = 0.5


def is_mtp_head(head) -> bool:
    """An MTP head (drafts from the backbone's cache), not a standalone drafter (own cache,
    `begin`) nor no drafter at all."""
    return head is not None and not hasattr(head, "begin")


def gives_draft_probs(head) -> bool:
    """An MTP head whose draft also gives each draft's probability (MTPHead.draft's probs_out),
    which a chain needs to stop where the head is unsure."""
    return is_mtp_head(head) and "probs_out" in inspect.signature(head.draft).parameters


def wide_passes_pay(backbone) -> bool:
    """Where a pass of 6-7 rows (a tree, a long lookup chain) was measured to cost about a
    3-row one: bf16 activations over float weights. In fp32 or with Q8 weights it costs
    1.3x-1.7x; over the file's own weights (`load_backbone` without a dtype,
    `loaded_as_stored`) 2.0x-2.4x a step against a 3-row pass's 1.2x, so chains there, and
    lookup drafts beyond 3 only where a match is longer (default_lookup_start)."""
    return (
        backbone.dtype == torch.bfloat16
        and not backbone.native
        and not backbone.quantized
        and not backbone.loaded_as_stored
    )


def default_lookup(backbone) -> int:
    """Most prompt-lookup drafts per pass on this backbone: 6 where wide passes pay, else 8 (for
    long matches only: default_lookup_start)."""
    return WIDE_LOOKUP if wide_passes_pay(backbone) else NARROW_LOOKUP


def default_lookup_start(backbone, lookup: int) -> int:
    """The drafts of a lookup match no longer than its searched suffix: all `lookup` where wide
    passes pay; else 3 (each row of a pass costs ~20% of a step: the 4th-8th copied tokens pay
    only where the match already goes further back, where a copy is likelier to go on)."""
    return lookup if wide_passes_pay(backbone) else min(lookup, NARROW_LOOKUP_START)


def default_draft_confidence(backbone) -> float:
    """Where the MTP head's chain stops: NARROW_DRAFT_CONFIDENCE over narrow passes; where wide
    passes pay, every draft is verified (0: a row costs little there)."""
    return 0.0 if wide_passes_pay(backbone) else NARROW_DRAFT_CONFIDENCE


def head_drafts_pay(backbone, temperature: float) -> bool:
    """Whether the default drafts with the MTP head at this temperature on this backbone: always
    where wide passes pay; over narrow passes below NARROW_SAMPLING_LOOKUP_ALONE_FROM (greedy
    included), prompt lookup alone from there."""
    return wide_passes_pay(backbone) or temperature < NARROW_SAMPLING_LOOKUP_ALONE_FROM


def head_left_out(backbone, temperature: float, k=None, branches=None, draft_confidence=None) -> bool:
    """Whether the default leaves the MTP head out (k = 0, prompt lookup alone): none of k,
    branches, draft_confidence asked for and its drafts do not pay here (head_drafts_pay).
    `mtp generate` then does not load it."""
    return (k, branches, draft_confidence) == (None,) * 3 and not head_drafts_pay(backbone, temperature)


def lookup_words(lookup: int, start: int) -> str:
    """How `mtp generate` / `mtp bench` name a lookup setting."""
    if start < lookup:
        return f"prompt lookup of {start} drafts, up to {lookup} for a longer match"
    return f"prompt lookup up to {lookup}"


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """How one `generate` call drafts and verifies. k: drafts per pass in the drafter's chain
    (0: the drafter is left out, resolve's default for the MTP head when sampling hot over narrow
    passes: prompt lookup alone);
    branches: the MTP head's best first drafts verified per pass (> 1: a tree); lookup: most
    prompt-lookup drafts per pass (0: off); lookup_start: the drafts of a match no longer than its
    searched suffix, one more per token it matches before it (decoding.lookup_drafts);
    draft_confidence: the MTP head's chain stops before its first draft whose cumulative
    probability under the head is below it (0: every draft; decoding.confident_drafts);
    temperature 0: greedy, > 0: lossless sampling keyed by seed; lenient (top_k, min_ratio): NOT
    lossless verification (greedy only)."""

    k: int = CHAIN_K
    branches: int = 1
    lookup: int = 0
    lookup_start: int = 0
    draft_confidence: float = 0.0
    temperature: float = 0.0
    seed: int = 0
    lenient: tuple[int, float] | None = None

    @classmethod
    def resolve(
        cls,
        backbone,
        head=None,
        *,
        k: int | None = None,
        branches: int | None = None,
        lookup: int | None = None,
        lookup_start: int | None = None,
        draft_confidence: float | None = None,
        temperature: float = 0.0,
        seed: int = 0,
        lenient: tuple[int, float] | None = None,
        mtp: bool | None = None,
    ) -> DecodeConfig:
        """The configuration with every None filled in for this backbone and drafter: trees
        where they can run (the MTP head, greedy, not lenient) and pay (`wide_passes_pay`), else
        chains; K of 3 in a tree, 2 in a chain; prompt lookup beside the MTP head (default_lookup,
        default_lookup_start),
        off with a standalone drafter and in plain decoding (lookup alone is asked for explicitly);
        the MTP head's chain cut where it is unsure (default_draft_confidence). With none of k,
        branches, draft_confidence given, the MTP head is left out where its drafts do not pay
        when sampling (head_left_out: k = 0, prompt lookup alone with its defaults). mtp: whether
        the drafter is the MTP head (default: is_mtp_head(head)); True with head None resolves as
        for the head without loading one it would leave out.
        Values given are kept as they are (generate checks them)."""
        mtp = is_mtp_head(head) if mtp is None else mtp
        if mtp and head_left_out(backbone, temperature, k, branches, draft_confidence):
            k, draft_confidence = 0, 0.0  # the head left out; lookup's defaults below as beside it
        tree_ok = mtp and temperature == 0 and lenient is None
        if branches is None:  # a chain cut asked for (draft_confidence > 0) is a chain
            branches = TREE_BRANCHES if tree_ok and wide_passes_pay(backbone) and not draft_confidence else 1
        if k is None:
            k = TREE_K if branches > 1 else CHAIN_K
        if lookup is None:
            lookup = default_lookup(backbone) if mtp else 0
        if lookup_start is None:
            lookup_start = default_lookup_start(backbone, lookup)
        if draft_confidence is None:
            chain = gives_draft_probs(head) and branches == 1
            draft_confidence = default_draft_confidence(backbone) if chain else 0.0
        return cls(
            k=k,
            branches=branches,
            lookup=lookup,
            lookup_start=lookup_start,
            draft_confidence=draft_confidence,
            temperature=temperature,
            seed=seed,
            lenient=lenient,
        )
