"""The evaluation sets of bench/: well formed, and the two written independently of the
training sources (heldout_set: reported only; dev_set: where held-out-style levers are
decided) share no 8-word sequence with each other, with eval_set or with any training file."""

import collections
import os

import pytest

from mtp_kernels import data, selfinstruct as si

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETS = ("eval_set", "heldout_set", "dev_set")
INDEPENDENT = ("heldout_set", "dev_set")
TRAINING = ("train_prompts", "selfinstruct_prompts", "gemma3_train_prompts")


def path(name: str, folder: str = "bench") -> str:
    return os.path.join(ROOT, folder, f"{name}.jsonl")


def rows(name: str) -> list[dict]:
    return data.read_jsonl(path(name))


@pytest.mark.parametrize("name", SETS)
def test_sets_are_well_formed_and_without_duplicates(name):
    prompts = rows(name)
    assert all(set(p) >= {"task", "prompt"} and p["task"] in data.TASKS for p in prompts)
    assert all(isinstance(p["prompt"], str) and p["prompt"].strip() for p in prompts)
    assert len({p["prompt"] for p in prompts}) == len(prompts)
    if name in INDEPENDENT:  # the floor: >= 30 prompts per task
        counts = collections.Counter(p["task"] for p in prompts)
        assert set(counts) == set(data.TASKS) and min(counts.values()) >= 30, counts


def assert_no_shared_text(name: str, others: list[str]) -> None:
    """No prompt of set `name` shares an 8-word sequence with any file of `others`."""
    mine = rows(name)
    for where in others:
        banned = si.set_shingles([where])
        shared = [p["prompt"][:60] for p in mine if si.shingles(p["prompt"]) & banned]
        assert not shared, f"{name} shares an 8-word sequence with {os.path.relpath(where, ROOT)}: {shared}"


@pytest.mark.parametrize("name", INDEPENDENT)
def test_independent_sets_share_no_text_with_training_or_the_other_sets(name):
    assert_no_shared_text(name, [path(s) for s in SETS if s != name] + [path(t, "data") for t in TRAINING])


GEMMA_TASKS = {"email", "story", "howto"}


@pytest.mark.parametrize("name", ["gemma3_continuations", "gemma3_dev_set"])
def test_gemma3_sets_are_well_formed(name):
    prompts = rows(name)
    assert all(set(p) == {"task", "prompt"} and p["task"] in GEMMA_TASKS for p in prompts)
    assert all(isinstance(p["prompt"], str) and p["prompt"].strip() for p in prompts)
    assert len({p["prompt"] for p in prompts}) == len(prompts)
    counts = collections.Counter(p["task"] for p in prompts)
    assert set(counts) == GEMMA_TASKS and min(counts.values()) >= (30 if name == "gemma3_dev_set" else 10), counts


def test_gemma3_dev_set_shares_no_text_with_the_reported_set_or_training():
    """Gemma 3's dev set (where its levers are decided) apart from its reported continuation
    set and from every training file, 8-word sequences as above."""
    assert_no_shared_text("gemma3_dev_set", [path("gemma3_continuations")] + [path(t, "data") for t in TRAINING])
