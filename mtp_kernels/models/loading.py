"""Loading what `mtp generate` / `mtp bench` run: the backbone (the file's own weights, or
dequantized), the MTP head and the standalone drafter, with the shipped defaults. The library
entry points the CLI uses; each logs its notes through `log` (one line per note)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .checkpoint import CheckpointError

SHIPPED_HEADS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "heads")
NATIVE_DTYPE = "bfloat16"  # activations, norms and KV cache of a backbone that runs the file's own weights
# Gemma 3's: bf16 measured no faster over its GGUF weights (5.3-5.8 against 5.5-5.8 ms a step,
# bench/gemma3_step_times.py: the activations are quantized to int8 blocks inside mtp.linear
# either way), so fp32, nearer the reference.
GEMMA3_NATIVE_DTYPE = "float32"


@dataclass(frozen=True)
class FamilyDefaults:
    """A family's defaults: its default model's shipped head (folder under SHIPPED_HEADS; the
    drafter's is `<head>-drafter`) and the dtype of the head's matrices (None: the backbone's;
    a key of head.HEAD_BLOCK_TYPES: that GGUF block type, quantized once at the first draft,
    the float matrices then freed: MTPHead.drafting_only)."""

    head: str
    head_matrix_dtype: str | None


DEFAULTS = {
    # SmolLM2: the head's matrices in Q4_1 (x8), quantized once from the shipped bf16 (Q8_0
    # before, bf16 before that: a draft right after a pass 1.23 -> 0.89 ms, RESULTS 2026-12-03
    # night): a draft reads its weights from the caches or DRAM, Q4_1 0.59x Q8_0's bytes; on
    # bench/dev_set.jsonl decode +0.3-2.9% side by side, tau within 0.02 (RESULTS, "The
    # head's matrices in Q4_1").
    "llama": FamilyDefaults("smollm2-135m", "q4_1"),
    # Gemma 3: activations fp32, the head's matrices Q4_1 too (Q8_0 before, bf16 before that: a
    # K = 2 draft 1.86 -> 1.38 ms right after a pass in Q8_0): on bench/gemma3_dev_set.jsonl decode
    # +0.5-2.1% over Q8_0 side by side, tau within 0.01 (RESULTS, "A Gemma 3 dev set"). Its head
    # drafts by default since its draft LM head is gathered once (MTPHead.draft_lm_head): head +
    # lookup measured faster than lookup alone (RESULTS, 2026-12-03; again on the dev set).
    "gemma3": FamilyDefaults("gemma3-270m", "q4_1"),
}


def load_head(path: str | None, backbone, log, default_model: bool = True, matrices: str | None = None):
    """The head to draft with: --head PATH, else the family's shipped head (strictly when the
    backbone is the default model, default_model: SmolLM2 when no --model is given; else where
    it fits, e.g. Gemma 3 270M's on that file), else an untrained (random, seeded) head,
    labelled. Its matrices in `matrices` (default: the family's, FamilyDefaults); block-type
    ones make it drafting_only (MTPHead.freeze_for_drafting at its first draft)."""
    import torch

    from .head import HEAD_BLOCK_TYPES, HeadConfig, MTPHead
    from .llama import DTYPES

    family = DEFAULTS[backbone.family]
    shipped = os.path.join(SHIPPED_HEADS, family.head)
    has_shipped = os.path.isfile(os.path.join(shipped, "config.json"))
    matrices = matrices or family.head_matrix_dtype
    # The parameters in their matrices' dtype; quantized ones stay in bf16, the dtype heads
    # ship in (Q8_0 is made from those values; an fp32 copy would only cost memory).
    quantized = matrices in HEAD_BLOCK_TYPES
    dtype = DTYPES[matrices] if matrices in DTYPES else torch.bfloat16 if quantized else backbone.dtype
    head = None
    if path or (has_shipped and default_model):
        head = MTPHead.load(path or shipped, dtype=dtype, backbone_cfg=backbone.cfg)
    elif has_shipped:  # another model of the family: the shipped head where it fits
        try:
            head = MTPHead.load(shipped, dtype=dtype, backbone_cfg=backbone.cfg)
        except CheckpointError as e:
            log(f"note: the shipped {family.head} head does not fit this model ({e})")
    if head is None:
        torch.manual_seed(0)
        head = MTPHead(HeadConfig.for_backbone(backbone.cfg, kv_layer=_global_layer(backbone.cfg)))
    head.check_fits(backbone.cfg)
    if quantized and not head.fits_block_type(matrices):  # rows not whole blocks: the backbone's dtype
        name = str(backbone.dtype).removeprefix("torch.")
        log(f"note: this head's matrices do not fit {matrices} blocks; it drafts in {name}")
        quantized, dtype = False, backbone.dtype
    head.to(dtype)  # once here: draft() would otherwise cast every weight per call
    head.matrix_dtype = matrices if quantized else dtype
    # Block-type matrices are made at the first draft, the float ones freed then: after
    # loading's peak (at load the quantizer's temporaries added ~3 MB to mtp generate's peak RSS).
    head.drafting_only = quantized
    if not head.cfg.trained:
        log(
            "note: UNTRAINED MTP head (random weights): drafts are rarely accepted, so expect no speedup; "
            "the output is still exactly the backbone's own (greedy, or sampled with the same seed)"
        )
    return head


def _global_layer(cfg) -> int:
    """The last layer whose cache holds every position (a Gemma 3 sliding layer's does not
    serve the head: it was written to be read through a window); -1 for Llama."""
    layers = getattr(cfg, "global_layers", None)
    return layers[-1] if layers else -1


def load_drafter(path: str | None, backbone, log):
    """The standalone drafter: --drafter-path, else the one shipped for the default model.
    A missing shipped drafter is a CheckpointError, one that does not fit the backbone a
    ValueError (both one line in the CLI)."""
    from .drafter import StandaloneDrafter

    folder = path or os.path.join(SHIPPED_HEADS, DEFAULTS[backbone.family].head + "-drafter")
    if path is None and not os.path.isfile(os.path.join(folder, "config.json")):
        raise CheckpointError(
            f"no standalone drafter at {folder}: train one with `mtp train --drafter standalone` or pass --drafter-path"
        )
    drafter = StandaloneDrafter.load(folder)
    try:
        drafter.check_fits(backbone.cfg, backbone.family)
    except ValueError as e:
        raise ValueError(f"{folder}: {e}") from None
    drafter.to(backbone.dtype)
    if not drafter.trained:
        log("note: UNTRAINED standalone drafter: drafts are rarely accepted; the output is still the backbone's own")
    return drafter


def load_backbone(model_path: str | None, dtype: str | None, log, int8: bool = False, int8_dot: bool = False):
    """(cfg, backbone, tokenizer, description). dtype None (the default): the file's own weights
    as stored (a GGUF's 4-/8-bit blocks, zero-copy from its memory map; bf16 activations);
    a file whose blocks the kernels cannot read runs dequantized instead, with a note. dtype
    'float32'|'bfloat16' (or --int8): every weight dequantized to fp32, then kept in dtype (or Q8).
    A backbone loaded without a dtype is marked `loaded_as_stored` (its default decode: chains, and
    lookup drafts beyond 3 for longer matches only: config.wide_passes_pay). A `gemma3` GGUF runs
    on models.gemma3_backbone instead."""
    from . import checkpoint

    try:
        return _load_llama(model_path, dtype, log, int8, int8_dot)
    except checkpoint.OtherFamilyError:  # a gemma3 GGUF (its header parsed twice: ~0.5 s for 262k tokens)
        return _load_gemma3(model_path, dtype, int8)


def _load_llama(model_path: str | None, dtype: str | None, log, int8: bool, int8_dot: bool):
    from ..gguf import X8_TYPES, type_name
    from . import checkpoint
    from .llama import DTYPES, Backbone, MixedTypesError

    as_stored = dtype is None and not int8
    if as_stored:
        try:
            cfg, weights, tok = checkpoint.load(model_path, native=True)
            model = Backbone(cfg, weights, DTYPES[NATIVE_DTYPE])
            model.loaded_as_stored = True
            types = {model.gguf_type(n) for n in weights} - {None}
            x8 = " (x8 order)" if any(t in X8_TYPES for t in types) else ""  # the same bytes, 8 rows interleaved
            what = (
                f"{'/'.join(type_name(t) for t in sorted({t % 100 for t in types}))} weights as stored{x8}, "
                f"{NATIVE_DTYPE} activations"
                if types
                else NATIVE_DTYPE
            )
            return cfg, model, tok, what
        except (checkpoint.NotNativeError, MixedTypesError) as e:
            log(f"note: {e}; running it dequantized ({NATIVE_DTYPE})")
            dtype = NATIVE_DTYPE
    dtype = dtype or "float32"
    cfg, weights, tok = checkpoint.load(model_path)
    model = Backbone(cfg, weights, DTYPES[dtype], quantize=int8, int8_dot=int8_dot)
    model.loaded_as_stored = as_stored  # the dequantized fallback still counts: no dtype was asked for
    return (
        cfg,
        model,
        tok,
        (f"dequantized, {dtype}{', int8 weights' if int8 else ''}{' and activations' if int8_dot else ''}"),
    )


def _load_gemma3(path: str, dtype: str | None, int8: bool):
    """A Gemma 3 GGUF on the kernels (models.gemma3_backbone): its matrices as stored (dtype
    None) or dequantized to fp32 then kept in dtype; activations in GEMMA3_NATIVE_DTYPE."""
    from . import gemma3
    from .gemma3_backbone import Gemma3Backbone
    from .llama import DTYPES

    if int8:
        raise CheckpointError(
            f"{path}: --int8 re-quantizes a Llama-family backbone; a Gemma 3 file runs its own weights "
            "(or --dtype float32|bfloat16)"
        )
    cfg, weights, tok = gemma3.load(path, native=dtype is None, widen=True)  # Q5_0 as Q8_0 in the arena
    model = Gemma3Backbone(cfg, weights, DTYPES[dtype or GEMMA3_NATIVE_DTYPE])
    model.loaded_as_stored = dtype is None
    if dtype is None:
        from ..gguf import type_name

        types = model.gguf_types()
        x8 = " (x8 order)" if any(t >= 100 for t in types) else ""
        names = "/".join(type_name(t) for t in sorted({t % 100 for t in types}))
        names = f"Q5_0 (run as Q8_0, the same bits)/{names}" if model.widened else names
        return cfg, model, tok, f"{names} weights as stored{x8}, {GEMMA3_NATIVE_DTYPE} activations"
    return cfg, model, tok, f"dequantized, {dtype}"


def release_freed_memory() -> None:
    """Hands the heap pages freed by loading (the loader's and the head's transient copies, the
    fp64 RoPE tables) back to the OS (glibc's malloc_trim; elsewhere nothing): ~15 MB of the
    peak RSS of `mtp generate`."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
