"""Prompts for the on-device tasks the head is trained and evaluated on.

Source texts come from corpora that install offline (Debian `fortunes`, `python3.11-doc`,
`debian-handbook`); the targets are written later by the frozen backbone itself (greedy
self-distillation, see train.py). Every source passage belongs to exactly one split,
chosen by a hash of its text, so no evaluation prompt shares a passage with training.

    python -m mtp_kernels.data --train data/train_prompts.jsonl --eval bench/eval_set.jsonl

rebuilds the two committed files (training needs only the files, not the corpora).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import html.parser
import json
import os
import random
import re

TASKS = ("summary", "proofread", "reply", "chat")
FORTUNES = "/usr/share/games/fortunes"
PYTHON_DOCS = "/usr/share/doc/python3.11/html/_sources"
HANDBOOK = "/usr/share/doc/debian-handbook/html/en-US"
NAMES = ("Alex", "Sam", "Maria", "Jordan", "Priya", "Chen", "Lea", "Omar", "Kim", "Tom", "Ana", "Yuki")


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def fortunes() -> list[str]:
    out = []
    for path in sorted(glob.glob(os.path.join(FORTUNES, "*"))):
        if "." in os.path.basename(path) or os.path.isdir(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for item in f.read().split("\n%\n"):
                # Skip ASCII art and tab-laid-out pieces: they are not messages.
                if 40 <= len(item) <= 400 and "\t" not in item and "  " * 4 not in item:
                    out.append(_clean(item))
    return out


_RST_ROLE = re.compile(r":[a-z:]+:`!?~?([^`<]*?)(?:\s*<[^>]*>)?`")


def python_doc_paragraphs() -> list[str]:
    out = []
    for path in sorted(glob.glob(os.path.join(PYTHON_DOCS, "**", "*.rst.txt"), recursive=True)):
        if "whatsnew" in path or "c-api" in path:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for para in f.read().split("\n\n"):
                lines = para.strip("\n").split("\n")
                # Prose only: no directives, code, tables, headings or indented blocks.
                if any(ln.startswith((" ", "..", ">>>", "*", "=", "-", "+", "|")) or ln.endswith("::") for ln in lines):
                    continue
                text = _clean(_RST_ROLE.sub(r"\1", para).replace("``", ""))
                if 120 <= len(text) <= 600 and "`" not in text:
                    out.append(text)
    return out


class _Paragraphs(html.parser.HTMLParser):
    """Text of the handbook's <div class="para"> blocks (nested divs, e.g. examples, dropped)."""

    def __init__(self):
        super().__init__()
        self.depth, self.buf, self.paras = 0, [], []

    def handle_starttag(self, tag, attrs):
        if tag == "div" and (self.depth or ("class", "para") in attrs):
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "div" and self.depth:
            self.depth -= 1
            if not self.depth:
                self.paras.append(_clean("".join(self.buf)))
                self.buf = []

    def handle_data(self, data):
        if self.depth == 1:
            self.buf.append(data)


def handbook_paragraphs() -> list[str]:
    out = []
    for path in sorted(glob.glob(os.path.join(HANDBOOK, "*.html"))):
        parser = _Paragraphs()
        with open(path, encoding="utf-8", errors="replace") as f:
            parser.feed(f.read())
        out += [p for p in parser.paras if 120 <= len(p) <= 600]
    return out


# ---- typos for the proofreading task --------------------------------------------------
def add_typos(text: str, rng: random.Random, rate: float = 0.12) -> str:
    """About `rate` of the words get one error: swapped, dropped or doubled letter, or a
    lost capital / apostrophe."""
    words = text.split(" ")
    for i, w in enumerate(words):
        if len(w) < 4 or not w.isalpha() or rng.random() >= rate:
            continue
        j = rng.randrange(1, len(w) - 1)
        kind = rng.randrange(4)
        if kind == 0:
            w = w[:j] + w[j + 1] + w[j] + w[j + 2 :]
        elif kind == 1:
            w = w[:j] + w[j + 1 :]
        elif kind == 2:
            w = w[:j] + w[j] + w[j:]
        else:
            w = w.lower() if w[0].isupper() else w[:j] + rng.choice("aeiou") + w[j + 1 :]
        words[i] = w
    return " ".join(words).replace("'s ", "s ", 1 if rng.random() < 0.5 else 0)


# ---- prompts --------------------------------------------------------------------------
def _thread(msgs: list[str], rng: random.Random) -> str:
    people = rng.sample(NAMES, 3)
    return "\n".join(f"{people[i % len(people)]}: {m}" for i, m in enumerate(msgs))


def make_prompt(task: str, rng: random.Random, short: list[str], long: list[str]) -> tuple[str, list[str]]:
    """One prompt of `task` and the source passages it uses (drawn from the pools)."""
    if task == "summary":
        if rng.random() < 0.5:
            srcs = [short.pop() for _ in range(rng.randint(2, 4))]
            text = _thread(srcs, rng)
            ask = rng.choice(
                [
                    "Summarize this group chat in one sentence:",
                    "Summarize these notifications in one short sentence:",
                    "Give a one-line summary of this conversation:",
                ]
            )
        else:
            srcs = [long.pop()]
            text = srcs[0]
            ask = rng.choice(
                [
                    "Summarize this email in one sentence:",
                    "Summarize this notification briefly:",
                    "Write a short summary of this message:",
                ]
            )
        return f"{ask}\n\n{text}", srcs
    if task == "proofread":
        srcs = [long.pop()]
        ask = rng.choice(
            [
                "Proofread this text and fix its spelling mistakes. Reply with the corrected text only.",
                "Correct the typos in this message. Output only the corrected message.",
                "Fix the spelling and grammar of the following text:",
            ]
        )
        return f"{ask}\n\n{add_typos(srcs[0], rng)}", srcs
    if task == "reply":
        srcs = [short.pop()] if rng.random() < 0.6 else [short.pop(), short.pop()]
        text = srcs[0] if len(srcs) == 1 else _thread(srcs, rng)
        ask = rng.choice(
            [
                "Suggest a short, friendly reply to this message:",
                "Write a quick reply to this text message:",
                "Reply briefly to this message:",
            ]
        )
        return f"{ask}\n\n{text}", srcs
    if task == "chat":
        srcs = [long.pop()] if rng.random() < 0.5 else [short.pop()]
        ask = rng.choice(
            [
                "Explain this in simple terms:",
                "What does this mean? Answer in a few sentences.",
                "Tell me more about the following:",
            ]
            if len(srcs[0]) > 200
            else [
                "What do you think this saying means?",
                "Is this good advice? Explain briefly.",
                "Explain the joke or the idea in this quote:",
            ]
        )
        return f"{ask}\n\n{srcs[0]}", srcs
    raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")


def hash64(text: str) -> int:
    """A 64-bit hash of text, the same in every process (Python's hash() is salted)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def in_eval_split(text: str, eval_fraction: float) -> bool:
    return hash64(text) / 2**64 < eval_fraction


def build(per_task_train: int, per_task_eval: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(train, eval) prompt lists; each item {"task", "prompt"}. Needs the corpora."""
    short = sorted(set(fortunes()))
    long = sorted(set(python_doc_paragraphs() + handbook_paragraphs()))
    if not short or not long:
        raise RuntimeError("corpora missing: install the Debian packages fortunes, python3.11-doc, debian-handbook")
    splits = []
    for is_eval, per_task in ((False, per_task_train), (True, per_task_eval)):
        rng = random.Random(f"{seed}-{is_eval}")
        s = [t for t in short if in_eval_split(t, 0.1) == is_eval]
        lg = [t for t in long if in_eval_split(t, 0.1) == is_eval]
        rng.shuffle(s)
        rng.shuffle(lg)
        splits.append(
            [{"task": task, "prompt": make_prompt(task, rng, s, lg)[0]} for _ in range(per_task) for task in TASKS]
        )
    return splits[0], splits[1]


# ---- continuation prompts (a base model, such as Gemma 3 270M, has no chat template) ---------
def continuation_prompts(paths: list[str], count: int, seed: int = 0, exclude: list[str] = ()) -> list[dict]:
    """{"task": "continuation", "prompt"} rows: the text of each task prompt of `paths` (what
    follows its instruction line: a passage, a thread, a written message), cut after 8 to 48 of
    its words, as a text to continue; `count` of them (0: all), drawn with `seed`, deduplicated,
    none sharing an 8-word sequence with the `exclude` sets. Needs only committed files."""
    from .selfinstruct import shingles

    banned = set().union(set(), *(shingles(p["prompt"]) for path in exclude for p in read_jsonl(path)))
    rng, seen, out = random.Random(f"continuations-{seed}"), set(), []
    rows = [r for path in paths for r in read_jsonl(path)]
    rng.shuffle(rows)
    for r in rows:
        text = r["prompt"].split("\n\n", 1)[-1].strip()
        words = list(re.finditer(r"\S+", text))
        if len(words) < 12:
            continue
        prompt = text[: words[min(len(words) - 4, rng.randint(8, 48)) - 1].end()]
        key = " ".join(re.findall(r"\w+", prompt.lower()))
        if key in seen or shingles("\n\n" + prompt) & banned:
            continue
        seen.add(key)
        out.append({"task": "continuation", "prompt": prompt, "source": r.get("source", "corpora")})
        if len(out) == count:
            break
    return out


def read_jsonl(path: str) -> list:
    """One JSON value per non-blank line; a line that is not UTF-8 or not JSON (or nested too
    deep) is a ValueError naming path:line."""
    with open(path, "rb") as f:
        raw = f.read()
    rows = []
    for i, line in enumerate(raw.removeprefix(b"\xef\xbb\xbf").split(b"\n"), 1):  # a UTF-8 BOM is not JSON
        try:
            text = line.decode("utf-8")
            if text.strip():
                rows.append(json.loads(text))
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}:{i}: not valid UTF-8 (byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{i}: not valid JSON ({e.msg})") from None
        except RecursionError:
            raise ValueError(f"{path}:{i}: not valid JSON (nested too deep)") from None
    return rows


def write_jsonl(path: str, rows: list[dict], mode: str = "w") -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, mode, encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def append_jsonl(path: str, rows: list[dict]) -> None:
    write_jsonl(path, rows, "a")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", required=True)
    p.add_argument("--eval", help="the evaluation set to write (not with --continuations)")
    p.add_argument("--per-task-train", type=int, default=600)
    p.add_argument("--per-task-eval", type=int, default=40)
    p.add_argument(
        "--continuations",
        type=int,
        metavar="N",
        help="instead: N continuation prompts (a base model's training set) from the texts of "
        "data/train_prompts.jsonl and data/selfinstruct_prompts.jsonl",
    )
    p.add_argument("--exclude", nargs="*", default=[], help="with --continuations: held-out sets to stay apart from")
    a = p.parse_args()
    if a.continuations:
        here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
        sources = [os.path.join(here, f) for f in ("train_prompts.jsonl", "selfinstruct_prompts.jsonl")]
        rows = continuation_prompts(sources, a.continuations, exclude=a.exclude)
        write_jsonl(a.train, rows)
        print(f"{len(rows)} continuation prompts -> {a.train}")
        return
    if not a.eval:
        p.error("--eval is required (or --continuations N)")
    train, ev = build(a.per_task_train, a.per_task_eval)
    write_jsonl(a.train, train)
    write_jsonl(a.eval, ev)
    print(f"{len(train)} training prompts -> {a.train}; {len(ev)} evaluation prompts -> {a.eval}")


if __name__ == "__main__":
    main()
