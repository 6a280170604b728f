"""bench/proofread_gap.py's counts: copies and edits of an answer against the message it
corrects, and the passes prompt lookup alone takes to decode a fixed answer."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import proofread_gap  # noqa: E402


def test_copies_and_edits():
    msg = [1, 2, 3, 4, 5, 6, 7, 8]
    assert proofread_gap.copies_and_edits(msg, msg) == (8, 0)
    assert proofread_gap.copies_and_edits(msg, [1, 2, 9, 4, 5, 6, 7, 8]) == (7, 1)  # one word changed
    assert proofread_gap.copies_and_edits(msg, [1, 2, 3, 9, 9, 4, 5, 7, 8]) == (7, 2)  # an insert, a delete
    assert proofread_gap.copies_and_edits(msg, [1, 2, 3, 4]) == (4, 0)  # cut short: the rest is no edit
    assert proofread_gap.copies_and_edits(msg, [10, 11]) == (0, 1)


def test_lookup_passes_replays_prompt_lookup():
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    # the answer copies the prompt: the first pass finds no match ([16, 5] occurs nowhere), the
    # second [5, 6]: 3 drafts (7, 8, 9), the third [8, 9, 10], matched 3 tokens further back: 6
    # drafts, 2 of them still inside the answer; each pass also adds the backbone's token
    answer = [5, 6, 7, 8, 9, 10, 11, 12]
    assert proofread_gap.lookup_passes(prompt, answer, 3, 8) == 3
    assert proofread_gap.lookup_passes(prompt, answer, 1, 1) == 4
    assert proofread_gap.lookup_passes(prompt, [1, 2, 3, 4], 3, 8) == 3  # nothing to copy: a token a pass
    assert proofread_gap.lookup_passes(prompt, [1], 3, 8) == 0
