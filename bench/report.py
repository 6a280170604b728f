"""Markdown table from a pytest-benchmark JSON file: per group, ours ("mtp") against the
torch implementation, with GB/s of the bytes each case declares next to the bandwidth
measured in the same run (bench_bandwidth.py).

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
    lines += ["", "| case | mtp median (us) | torch median (us) | speedup | mtp GB/s | % of read bandwidth |",
              "|---|---:|---:|---:|---:|---:|"]
    for group, impls in groups.items():
        if "mtp" not in impls or "torch" not in impls:
            continue
        ours, theirs = impls["mtp"], impls["torch"]
        ratio = theirs["stats"]["median"] / ours["stats"]["median"]
        share = f"{100 * gbps(ours) / read:.0f}%" if read else "n/a"
        lines.append(f"| {group} | {ours['stats']['median'] * 1e6:.1f} | {theirs['stats']['median'] * 1e6:.1f} "
                     f"| {ratio:.2f}x | {gbps(ours):.1f} | {share} |")
    return "\n".join(lines)


def main(argv):
    _, groups = load(argv[1])
    print(table(groups))


if __name__ == "__main__":
    main(sys.argv)
