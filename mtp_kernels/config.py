"""The decoding defaults, in one place for the library and the CLI: `decoding.generate(...)`
and `mtp generate` given the same backbone, drafter and mode resolve the same configuration.

The values are measured (bench/RESULTS.md): prompt lookup of up to 6 tokens beside the MTP
head ("Prompt lookup beside the head"); trees of the head's chain of 3 and its 3 best first
drafts where a tree pass costs about a chain's (greedy, the bf16 backbone dequantized on
request), else chains of 2 ("Tree drafts").
"""

from __future__ import annotations

import dataclasses

import torch

DEFAULT_LOOKUP = 6  # most prompt-lookup drafts per pass beside the MTP head
TREE_K, TREE_BRANCHES, CHAIN_K = 3, 3, 2


def is_mtp_head(head) -> bool:
    """An MTP head (drafts from the backbone's cache), not a standalone drafter (own cache,
    `begin`) nor no drafter at all."""
    return head is not None and not hasattr(head, "begin")


def trees_pay(backbone) -> bool:
    """Where a tree pass (6 rows) was measured to cost about a chain's (3 rows): bf16
    activations over float weights. In fp32 or with Q8 weights it costs 1.3x-1.7x; over the
    file's own weights (`load_backbone` without a dtype, `loaded_as_stored`) it is not
    measured yet, so chains there."""
    return (
        backbone.dtype == torch.bfloat16
        and not backbone.native
        and not backbone.quantized
        and not backbone.loaded_as_stored
    )


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """How one `generate` call drafts and verifies. k: drafts per pass in the drafter's chain;
    branches: the MTP head's best first drafts verified per pass (> 1: a tree); lookup: most
    prompt-lookup drafts per pass (0: off); temperature 0: greedy, > 0: lossless sampling
    keyed by seed; lenient (top_k, min_ratio): NOT lossless verification (greedy only)."""

    k: int = CHAIN_K
    branches: int = 1
    lookup: int = 0
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
        temperature: float = 0.0,
        seed: int = 0,
        lenient: tuple[int, float] | None = None,
    ) -> DecodeConfig:
        """The configuration with every None filled in for this backbone and drafter: trees
        where they can run (the MTP head, greedy, not lenient) and pay (`trees_pay`), else
        chains; K of 3 in a tree, 2 in a chain; prompt lookup beside the MTP head, off with a
        standalone drafter and in plain decoding (lookup alone is asked for explicitly).
        Values given are kept as they are (generate checks them)."""
        mtp = is_mtp_head(head)
        tree_ok = mtp and temperature == 0 and lenient is None
        if branches is None:
            branches = TREE_BRANCHES if tree_ok and trees_pay(backbone) else 1
        if k is None:
            k = TREE_K if branches > 1 else CHAIN_K
        if lookup is None:
            lookup = DEFAULT_LOOKUP if mtp else 0
        return cls(k=k, branches=branches, lookup=lookup, temperature=temperature, seed=seed, lenient=lenient)
