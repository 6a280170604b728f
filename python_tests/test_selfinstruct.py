"""Self-instruct prompts: the backbone's texts are reproducible and independent of the batch,
an interrupted run resumes from its cache, and no prompt overlaps an excluded evaluation set."""

import json
import random

import pytest
import torch

from mtp_kernels import data, selfinstruct as si, train
from tiny_model import write_tiny_folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from mtp_kernels.models.checkpoint import load
    from mtp_kernels.models.llama import Backbone

    folder = tmp_path_factory.mktemp("tiny")
    write_tiny_folder(folder)
    cfg, weights, tok = load(str(folder))
    return Backbone(cfg, weights), tok


def test_plan_is_seeded_interleaved_and_a_prefix_of_a_longer_plan():
    a, b = si.plan(3, seed=1), si.plan(5, seed=1)
    assert a == b[: len(a)] and a != si.plan(3, seed=2)
    assert [r["task"] for r in a] == list(data.TASKS) * 3
    assert all(r["kind"] in si.KINDS[r["task"]] for r in b)
    threads = [r for r in b if r["kind"] == "thread"]
    assert threads and all(2 <= len(r["seeds"]) <= 4 for r in threads)


def test_seed_0_keeps_the_first_pools_and_later_seeds_add_the_new_ones():
    """data/selfinstruct_prompts.jsonl (seed 0) stays reproducible after MORE_TOPICS/MORE_APPS
    were added; seed 1 (the second run, bench/RESULTS.md, not shipped) draws from both pools."""

    def topics(rows):
        seeds = " | ".join(s for r in rows for s in r["seeds"])
        return {t for t in si.TOPICS + si.MORE_TOPICS if f"about {t}." in seeds}

    first, later = topics(si.plan(200, seed=0)), topics(si.plan(200, seed=1))
    assert first <= set(si.TOPICS) and len(first) > 40
    assert later & set(si.MORE_TOPICS) and later & set(si.TOPICS)
    assert not set(si.TOPICS) & set(si.MORE_TOPICS) and not set(si.APPS) & set(si.MORE_APPS)


def test_write_rows_do_not_depend_on_the_batch_and_resume_from_the_cache(tiny, tmp_path, monkeypatch):
    backbone, tok = tiny
    seeds = [f"Write a message number {i}." for i in range(5)]
    one = si.write(backbone, tok, seeds, max_new_tokens=6, seed=3, batch=1, log=lambda m: None)
    cache = str(tmp_path / "texts.jsonl")
    three = si.write(backbone, tok, seeds, max_new_tokens=6, seed=3, batch=3, cache_path=cache, log=lambda m: None)
    assert one == three and len(set(one)) > 1  # sampled: texts differ between rows
    assert si.write(backbone, tok, seeds, max_new_tokens=6, seed=4, batch=5, log=lambda m: None) != one
    # A second run finds every text in the cache and writes nothing.
    monkeypatch.setattr(backbone, "forward", lambda *a, **k: pytest.fail("a cached text written again"))
    assert si.write(backbone, tok, seeds, max_new_tokens=6, seed=3, cache_path=cache, log=lambda m: None) == one
    # Other settings or another instruction at an index are not reused.
    lines = [json.loads(x) for x in open(cache)]
    assert [r["index"] for r in lines] == list(range(5)) and all(r["seed"] == 3 for r in lines)
    with pytest.raises(pytest.fail.Exception, match="written again"):
        si.write(backbone, tok, ["another"] + seeds[1:], max_new_tokens=6, seed=3, cache_path=cache, log=print)


def test_clean():
    assert si.clean('Sure! Here is the message:\n\n"Dinner moved to 8, see you there!"') == (
        "Dinner moved to 8, see you there!"
    )
    assert si.clean("Hi [Your Name], the meeting is at noon. Bring the slides. And the") == (
        "Hi Sam, the meeting is at noon. Bring the slides."
    )
    assert si.clean("The party is on [Date] at the usual place, right?") is None  # a placeholder left
    assert si.clean("Too short.") is None
    long = ("This sentence is long enough to count. " * 30).strip()
    assert len(si.clean(long)) <= 700 and si.clean(long).endswith(".")


def test_natural_typos_change_text_reproducibly():
    text = "I'm sure you're right, it's a bit late and I don't think the train will wait until ten."
    a, b = si.natural_typos(text, random.Random(0)), si.natural_typos(text, random.Random(0))
    assert a == b and a != text
    assert any(si.natural_typos(text, random.Random(s)) != a for s in range(1, 5))


def test_make_prompt_per_task():
    rng = random.Random(0)
    row = {"task": "summary", "kind": "thread", "names": ["Ana", "Tom", "Kim", "Lea"], "ask": 0.0}
    p = si.make_prompt(row, ["See you at the station at 5, ok?", "Sure, I will bring the tickets."], rng)
    assert p == (
        "Summarize this group chat in one sentence:\n\nAna: See you at the station at 5, ok?\n"
        "Tom: Sure, I will bring the tickets."
    )
    q = {"task": "chat", "kind": "question", "names": ["Ana"], "ask": 0.5}
    assert si.make_prompt(q, ['A: "What should I pack for a weekend hike?" is a good one.'], rng) == (
        "What should I pack for a weekend hike?"
    )
    assert si.make_prompt(q, ["No question asked in this reply at all."], rng) is None
    fix = {"task": "proofread", "kind": "message", "names": ["Ana"], "ask": 0.0}
    text = "I'm sure you're right, it's a bit late and I don't think the train will wait until ten."
    out = si.make_prompt(fix, [text], random.Random(0))
    assert out.startswith(si.ASK[("proofread", "")][0]) and not out.endswith(text)


def test_build_drops_duplicates_and_texts_near_an_excluded_set(tiny, tmp_path, monkeypatch):
    backbone, tok = tiny
    banned = "the quick brown fox jumps over the lazy dog near the river bank today."
    (tmp_path / "eval.jsonl").write_text(json.dumps({"task": "summary", "prompt": "Summarize: " + banned}) + "\n")
    texts = iter(
        ["The Quick brown fox jumps over the lazy dog near the river, fine.", "A fresh text about lunch."] * 20
    )

    def fake_write(backbone, tok, seeds, **kw):
        return [next(texts) if i % 3 else f"Unique text number {i} about a meeting at noon." for i in range(len(seeds))]

    monkeypatch.setattr(si, "write", fake_write)
    rows = si.build(backbone, tok, 4, [str(tmp_path / "eval.jsonl")], log=lambda m: None)
    prompts = [r["prompt"] for r in rows]
    assert rows and len(set(prompts)) == len(prompts)
    assert not any("quick brown fox jumps over the lazy dog" in p.lower() for p in prompts)
    assert {r["source"] for r in rows} == {"selfinstruct"} and {r["task"] for r in rows} <= set(data.TASKS)


def test_question_seeds_are_seeded_and_a_prefix_of_a_longer_run():
    a, b = si.question_seeds(4, seed=0), si.question_seeds(40, seed=0)
    assert a == b[:4] and a != si.question_seeds(4, seed=1)
    assert all(s.startswith("Write one question a person might ask about ") for s in b)
    assert {s.split(" about ", 1)[1].split(". Start", 1)[0] for s in b} <= set(si.SUBJECTS)
    assert len({s.split('"')[1] for s in b}) > 10 and {s.split('"')[1] for s in b} <= set(si.OPENINGS)


def test_first_question():
    assert si.first_question('Sure! Here is one:\n\n"How do I keep basil alive on a windowsill?"') == (
        "How do I keep basil alive on a windowsill?"
    )
    assert si.first_question("Question: What should I bring to a picnic in the park?") == (
        "What should I bring to a picnic in the park?"
    )
    assert si.first_question("A statement long enough to count, with no question at all.") is None
    assert si.first_question("What can a phone assistant do for my garden today?") is None  # about itself
    assert si.first_question("Question: Why me now? I keep wondering about it.") is None  # too short


def test_build_questions_keeps_distinct_questions_away_from_an_excluded_set(tiny, tmp_path, monkeypatch):
    backbone, tok = tiny
    banned = "how do i get the quick brown fox to jump over the lazy dog"
    (tmp_path / "eval.jsonl").write_text(json.dumps({"task": "chat", "prompt": banned.capitalize() + "?"}) + "\n")
    seen = {}

    def fake_write(backbone, tok, seeds, seed, **kw):
        seen.update(seeds=seeds, seed=seed)
        texts = [
            "How do I get the quick brown fox to jump over the lazy dog, in short?",  # near the excluded set
            "What is the best way to store fresh herbs in the fridge?",
            "What is the best way to store Fresh Herbs in the fridge?",  # the same words: a duplicate
            "No question in this text, only a statement long enough.",
        ]
        return [texts[i % 4] for i in range(len(seeds))]

    monkeypatch.setattr(si, "write", fake_write)
    rows = si.build_questions(backbone, tok, 8, [str(tmp_path / "eval.jsonl")], seed=2, log=lambda m: None)
    assert rows == [
        {"task": "chat", "prompt": "What is the best way to store fresh herbs in the fridge?", "source": "selfinstruct"}
    ]
    assert seen == {"seeds": si.question_seeds(8, seed=2), "seed": 102}


def test_distilled_rows_read_several_prompt_files(tiny, tmp_path):
    from mtp_kernels.models.checkpoint import load
    from mtp_kernels.models.llama import Backbone

    write_tiny_folder(tmp_path / "tiny")
    cfg, weights, tok = load(str(tmp_path / "tiny"))
    model = Backbone(cfg, weights, torch.bfloat16)
    for name, texts in (("a", "abc"), ("b", "xyz")):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": f"p {c}"}) + "\n" for c in texts))
    paths = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    rows, _ = train.distilled_rows(paths, str(tmp_path), 4, 2, model, tok, lambda m: None)
    want = [tok.encode(tok.apply_chat_template(f"p {c}")) for c in "abxy"]  # the first 2 of each file
    assert [r["prompt_ids"] for r in rows] == want
    (tmp_path / "b.jsonl").write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"b\.jsonl:2: expected JSON lines"):
        train.distilled_rows(paths, str(tmp_path), 4, 0, model, tok, lambda m: None)


def test_shingles_compare_texts_not_the_shared_instructions():
    ask = "Correct the typos in this message. Output only the corrected message."
    a, b = f"{ask}\n\nSee you at noon by the station.", f"{ask}\n\nThe cat sat on the mat all day long."
    assert not si.shingles(a) & si.shingles(b)  # the same 11-word instruction, different texts
    text = "one two three four five six seven eight nine"
    assert si.shingles(f"Summarize:\n\n{text}") & si.shingles(f"Explain this:\n\nzero {text}")


@pytest.mark.parametrize("args", [["--questions", "-1"], ["--per-task", "0"]])
def test_main_refuses_negative_counts_before_loading_anything(args, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["selfinstruct", "--out", str(tmp_path / "o.jsonl"), *args])
    with pytest.raises(SystemExit) as e:
        si.main()
    assert e.value.code == 2 and "must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
