"""Markdown table from a pytest-benchmark JSON file: per group, ours ("mtp") against the
torch implementation, with GB/s of the bytes each case declares next to the bandwidth
measured in the same run (bench_bandwidth.py); and the backbone passes of
bench_backbone.py: ms per pass, ours against transformers, and the cost of a verify pass
relative to a one-token step; and bench_fused.py: one call per pass against the same kernels
op by op, and what a tree pass and the head's alternatives cost over chains; and
bench_gguf.py: GGUF block-type weights read as stored against bf16 weights, GB/s of the
weight bytes against the read bandwidth, and 8-bit weights with bf16 against int8 activations.

    python bench/report.py results.json
"""

import json
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        data = json.load(f)
    groups = defaultdict(dict)
    for b in data["benchmarks"]:
        impl = b["params"].get("impl") if b.get("params") else None
        groups[b["group"]][impl or b["name"]] = b
    return data, groups


def gbps(b):
    return b["extra_info"]["bytes"] / b["stats"]["median"] / 1e9


def table(groups):
    bw = groups.pop("bandwidth", {})
    read = gbps(bw["test_bandwidth_read"]) if "test_bandwidth_read" in bw else None
    lines = []
    for name, b in bw.items():
        lines.append(f"- {name}: {gbps(b):.1f} GB/s (median of {b['stats']['rounds']})")
    # mtp_avx512 (bench_linear.py): the bf16 cases again on the avx512 path, where they ran.
    avx512 = any("mtp_avx512" in impls for impls in groups.values())
    extra = " mtp on avx512 (us) | avx512 / mtp |" if avx512 else ""
    lines += [
        "",
        "| case | mtp median (us) | torch median (us) | speedup | mtp GB/s | % of read bandwidth |" + extra,
        "|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if avx512 else ""),
    ]
    for group, impls in groups.items():
        if "mtp" not in impls or "torch" not in impls:
            continue
        ours, theirs = impls["mtp"], impls["torch"]
        ratio = theirs["stats"]["median"] / ours["stats"]["median"]
        share = f"{100 * gbps(ours) / read:.0f}%" if read else "n/a"
        line = (
            f"| {group} | {ours['stats']['median'] * 1e6:.1f} | {theirs['stats']['median'] * 1e6:.1f} "
            f"| {ratio:.2f}x | {gbps(ours):.1f} | {share} |"
        )
        if avx512:
            other = impls.get("mtp_avx512")
            line += (
                f" {other['stats']['median'] * 1e6:.1f} | {other['stats']['median'] / ours['stats']['median']:.2f}x |"
                if other
                else " | |"
            )
        lines.append(line)
    return "\n".join(lines)


def backbone_table(groups):
    """The groups of bench_backbone.py (extra_info backbone_tokens): ms per pass of each
    implementation, the speedup, and each pass's cost relative to the same implementation's
    one-token step (T=1)."""
    rows = {}
    for group in [g for g, impls in groups.items() if "backbone_tokens" in next(iter(impls.values()))["extra_info"]]:
        impls = groups.pop(group)
        rows[next(iter(impls.values()))["extra_info"]["backbone_tokens"]] = (group, impls)
    if not rows:
        return ""
    step = {impl: b["stats"]["median"] for impl, b in rows[min(rows)][1].items()}
    impls = [i for i in ("ours", "ours_int8", "ours_int8dot", "transformers") if i in step]
    lines = [
        "| case | "
        + " | ".join(f"{i} (ms)" for i in impls)
        + " | transformers / ours | "
        + " | ".join(f"{i}: pass / its T=1 step" for i in impls)
        + " |",
        "|---|" + "---:|" * (2 * len(impls) + 1),
    ]
    for _, (group, by_impl) in sorted(rows.items()):
        med = {impl: b["stats"]["median"] for impl, b in by_impl.items()}
        ms = [f"{med[i] * 1e3:.2f}" if i in med else "n/a" for i in impls]
        speedup = f"{med['transformers'] / med['ours']:.2f}x" if "transformers" in med and "ours" in med else "n/a"
        rel = [f"{med[i] / step[i]:.2f}x" if i in med else "n/a" for i in impls]
        lines.append(f"| {group} | " + " | ".join(ms) + f" | {speedup} | " + " | ".join(rel) + " |")
    return "\n".join(lines)


def fused_table(groups):
    """The groups of bench_fused.py (extra_info fused): ms per call, one call against op by op."""
    lines = ["| case | one call (ms) | op by op (ms) | op by op / one call |", "|---|---:|---:|---:|"]
    for group in [g for g, impls in groups.items() if "fused" in next(iter(impls.values()))["extra_info"]]:
        med = {impl: b["stats"]["median"] for impl, b in groups.pop(group).items()}
        if "one_call" in med and "op_by_op" in med:
            lines.append(
                f"| {group} | {med['one_call'] * 1e3:.2f} | {med['op_by_op'] * 1e3:.2f} "
                f"| {med['op_by_op'] / med['one_call']:.2f}x |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def tree_table(groups):
    """The tree groups of bench_fused.py (extra_info tree): ms per call, each against the first."""
    lines = ["| case | ms per call (median), each / the first |", "|---|---|"]
    for group in [g for g, impls in groups.items() if "tree" in next(iter(impls.values()))["extra_info"]]:
        med = {impl: b["stats"]["median"] for impl, b in groups.pop(group).items()}
        first = next(iter(med.values()))
        lines.append(
            f"| {group} | " + ", ".join(f"{impl} {m * 1e3:.2f} ({m / first:.2f}x)" for impl, m in med.items()) + " |"
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def gguf_table(groups):
    """bench_gguf.py's groups ("gguf <format> NxK M=m"): the file layout, the x8 layout (where the
    format has one) and bf16 weights; GB/s and the share of the read bandwidth of the faster
    GGUF layout."""
    cases = {g: groups.pop(g) for g in [g for g in groups if g.startswith("gguf ")]}
    if not cases:
        return ""
    bw = groups.get("bandwidth", {}).get("test_bandwidth_read")
    read = gbps(bw) if bw else None
    lines = [
        f"read bandwidth: {read:.1f} GB/s" if read else "read bandwidth: not measured in this run",
        "",
        "| case | file layout (us) | x8 layout (us) | best GB/s | % of read bandwidth | bf16 (us) "
        "| bf16 / best GGUF time |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    us = lambda b: f"{b['stats']['median'] * 1e6:.1f}" if b else "-"  # noqa: E731
    for group, impls in cases.items():
        q, x, f = impls.get("gguf"), impls.get("x8"), impls.get("bf16")
        if not q:
            continue
        best = min((b for b in (q, x) if b), key=lambda b: b["stats"]["median"])
        share = f"{100 * gbps(best) / read:.0f}%" if read else "-"
        ratio = f"{f['stats']['median'] / best['stats']['median']:.2f}x" if f else "-"
        lines.append(f"| {group[5:]} | {us(q)} | {us(x)} | {gbps(best):.1f} | {share} | {us(f)} | {ratio} |")
    acts = [
        "| case | Q8 weights, bf16 activations (us) | the same, int8 activations (us) | bf16 / int8 "
        "| Q8_0 x8, int8 activations (us) |",
        "|---|---:|---:|---:|---:|",
    ]
    for group, impls in cases.items():
        b, i, x = impls.get("q8_bf16x"), impls.get("q8_int8x"), impls.get("x8")
        if b and i:
            ratio = b["stats"]["median"] / i["stats"]["median"]
            acts.append(f"| {group[5:]} | {us(b)} | {us(i)} | {ratio:.2f}x | {us(x)} |")
    return "\n".join(lines + ([""] + acts if len(acts) > 2 else []))


def main(argv):
    _, groups = load(argv[1])
    sections = [gguf_table(groups), backbone_table(groups), fused_table(groups), tree_table(groups)]
    if set(groups) - {"bandwidth"}:
        sections.insert(0, table(groups))
    print("\n\n".join(s for s in sections if s))


if __name__ == "__main__":
    main(sys.argv)
