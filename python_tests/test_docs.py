"""The docs hold: every Python example runs as written, every relative link resolves, README stays short.

Covered: README.md, CONTRIBUTING.md and every docs/**/*.md (examples and links), plus
bench/RESULTS.md and bench/history/*.md (links). A ```python block runs with exec() in a fresh
namespace, in the order of its file. A block that cannot run in a test (needs a GPU, or takes
minutes) starts with the line `# not run in tests: <why>` and is skipped; use that sparingly.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
SKIP = "# not run in tests:"


def _docs() -> list[pathlib.Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _linked() -> list[pathlib.Path]:
    return _docs() + [ROOT / "bench" / "RESULTS.md", *sorted((ROOT / "bench" / "history").glob("*.md"))]


def _name(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT))


FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", path.read_text()), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    out.update(re.findall(r'<a (?:name|id)="([^"]+)"', path.read_text()))
    return out


def links(text: str) -> list[str]:
    text = FENCE.sub("", text)
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)


@pytest.mark.parametrize("path", _docs(), ids=_name)
def test_python_blocks_run(path):
    blocks = python_blocks(path.read_text())
    if path.name == "README.md":
        assert blocks, "README.md has no python example"
    for i, code in enumerate(blocks):
        if code.startswith(SKIP):
            reason = code.splitlines()[0][len(SKIP) :].strip()
            assert reason, f"{_name(path)} block {i}: `{SKIP}` needs a reason"
            continue
        exec(compile(code, f"{_name(path)} (python block {i})", "exec"), {})


@pytest.mark.parametrize("path", _linked(), ids=_name)
def test_relative_links_resolve(path):
    bad = []
    for target in links(path.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading with that anchor in {_name(dest)}")
    assert not bad, f"{_name(path)}: " + "; ".join(bad)


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move details to docs/"


def test_skip_marker_and_helpers():
    assert slug("`torch.ops.mtp.verify` in a decoding loop") == "torchopsmtpverify-in-a-decoding-loop"
    assert slug("What limits head + lookup on summaries") == "what-limits-head--lookup-on-summaries"
    assert links("[a](x.md#y) `[b](no.md)` ![c](d.png)\n```\n[e](f.md)\n```\n") == ["x.md#y", "d.png"]
    assert python_blocks("```python\nprint(1)\n```\n```python-no-run\nx\n```\n") == ["print(1)\n"]
