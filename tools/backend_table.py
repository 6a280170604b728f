"""The backend matrix of the ``mtp`` ops, generated from the code (so the docs cannot drift).

    python tools/backend_table.py            # print the table
    python tools/backend_table.py --write    # rewrite it between the markers of every doc
    python tools/backend_table.py --check    # exit 1 if a doc's table differs (the tests run this)

Where each column comes from:
- op list: the schemas, ``m.def("name(...`` in csrc/ops.cpp;
- CPU (C++) and CUDA C++: the ``m.impl("name"`` lines of the ``STABLE_TORCH_LIBRARY_IMPL(mtp, CPU|CUDA``
  blocks under csrc/ (the CUDA ones are only compiled with MTP_WITH_CUDA, hence from source);
- Triton: ``mtp_kernels.triton._OPS``; torch fallback: ``mtp_kernels.fallback.FALLBACKS``
  (both registered for CUDA at import where no C++ CUDA kernel exists);
- C API: the ``mtp_<op>`` / ``mtp_<op>_<variant>`` functions declared in csrc/include/mtp/mtp.h,
  each given to the longest op name it starts with.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/architecture.md")
BEGIN, END = "<!-- backends:begin -->", "<!-- backends:end -->"


def schema_ops() -> list[str]:
    return re.findall(r'm\.def\(\s*"(\w+)\(', (ROOT / "csrc/ops.cpp").read_text())


def cpp_impls(key: str) -> set[str]:
    found = set()
    for path in sorted((ROOT / "csrc").rglob("*.cpp")):
        for block in re.findall(
            r"STABLE_TORCH_LIBRARY_IMPL\(mtp,\s*" + key + r",\s*m\)\s*\{(.*?)\n\}", path.read_text(), re.S
        ):
            found.update(re.findall(r'm\.impl\(\s*"(\w+)"', block))
    return found


def c_api(ops: list[str]) -> dict[str, list[str]]:
    names = re.findall(r"MTP_API\s+mtp_status\s+(mtp_\w+)\(", (ROOT / "csrc/include/mtp/mtp.h").read_text())
    by_op: dict[str, list[str]] = {op: [] for op in ops}
    for fn in names:
        owners = [op for op in ops if fn == f"mtp_{op}" or fn.startswith(f"mtp_{op}_")]
        if owners:
            by_op[max(owners, key=len)].append(fn)
    return by_op


def python_kernels() -> tuple[set[str], set[str]]:
    sys.path.insert(0, str(ROOT))
    from mtp_kernels import fallback
    from mtp_kernels import triton as mtp_triton

    return set(mtp_triton._OPS), set(fallback.FALLBACKS)


def table() -> str:
    ops = schema_ops()
    cpu, cuda = cpp_impls("CPU"), cpp_impls("CUDA")
    triton, fallback = python_kernels()
    capi = c_api(ops)
    mark = lambda yes: "yes" if yes else "-"  # noqa: E731
    rows = ["| op | CPU (C++) | CUDA C++ | Triton | torch fallback (CUDA) | C API |", "|---|---|---|---|---|---|"]
    for op in ops:
        fns = ", ".join(f"`{f}`" for f in capi[op]) or "-"
        rows.append(
            f"| `{op}` | {mark(op in cpu)} | {mark(op in cuda)} | {mark(op in triton)} | "
            f"{mark(op in fallback)} | {fns} |"
        )
    return "\n".join(rows)


def splice(text: str, body: str) -> str | None:
    """``text`` with the part between the markers replaced by ``body``; None without markers."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        return None
    return text[: i + len(BEGIN)] + "\n" + body + "\n" + text[j:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the table between the markers of " + ", ".join(DOCS))
    g.add_argument("--check", action="store_true", help="exit 1 when a doc's table is not the generated one")
    args = p.parse_args(argv)
    body = table()
    if not (args.write or args.check):
        print(body)
        return 0
    stale = []
    for doc in DOCS:
        path = ROOT / doc
        text = path.read_text()
        new = splice(text, body)
        if new is None:
            print(f"{doc}: no {BEGIN} ... {END} markers", file=sys.stderr)
            return 1
        if new != text:
            stale.append(doc)
            if args.write:
                path.write_text(new)
    if args.check and stale:
        print(
            "stale backend table in " + ", ".join(stale) + ": run python tools/backend_table.py --write",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
