"""`mtp bench` (mtp_kernels/evaluate.py): per-task figures, the identity check against greedy,
its outputs, and bad input."""

import json
import sys

import pytest
import torch

from mtp_kernels import cli, evaluate
from mtp_kernels.models.head import HeadConfig, MTPHead
from test_drafter import copy_of_backbone
from tiny_model import TINY, OracleHead, tiny_backbone, write_tiny_folder


def test_summary_counts_tau_acceptance_and_identity():
    model = tiny_backbone()
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    tasks = ["a", "b", "a"]
    greedy = evaluate.run_ours(model, prompts, tasks, 12, ())
    full = {b: prompts[b] + r.tokens for b, r in enumerate(greedy)}
    spec = []
    for b, p in enumerate(prompts):  # the oracle knows request 0's future: run one request at a time
        spec += evaluate.run_ours(model, [p], [tasks[b]], 12, (), OracleHead({0: full[b]}, TINY.vocab_size, seed=b), 3)
    s = evaluate.summarize(spec, greedy)
    assert set(s) == {"a", "b"} and s["a"]["prompts"] == 2 and s["b"]["prompts"] == 1
    assert s["a"]["identical_to_greedy"] == 2 and s["a"]["token_agreement"] == 1.0
    passes = sum(r.passes for r in spec if r.task == "a")
    assert abs(s["a"]["tau"] - sum(len(r.tokens) - 1 for r in spec if r.task == "a") / passes) < 1e-12
    assert s["a"]["tau"] > 1 and all(0 <= a <= 1 for a in s["a"]["acceptance_by_position"])
    # A run that differs is counted, and its agreement is the shared prefix's share.
    wrong = [evaluate.Run(r.task, r.tokens[:5] + [0] * (len(r.tokens) - 5), 1.0, 1.0) for r in greedy]
    w = evaluate.summarize(wrong, greedy)
    assert w["b"]["identical_to_greedy"] == 0 and w["b"]["token_agreement"] == 5 / 12
    md = evaluate.markdown(
        {"command": "c", "setup": "s", "methods": {"ours_greedy": evaluate.summarize(greedy), "ours_mtp": s}}
    )
    assert "| a | ours_mtp |" in md and "2/2" in md


def test_restrict_vocab_takes_a_prefix_and_restores():
    head = MTPHead(HeadConfig.for_backbone(TINY))
    head.set_draft_vocab(torch.tensor([9, 4, 7, 3]))
    evaluate.restrict_vocab(head, 2)
    assert head.draft_vocab.tolist() == [9, 4]
    evaluate.restrict_vocab(head, 0)
    assert head.draft_vocab.tolist() == [9, 4, 7, 3]


def test_sweep_cuts_the_heads_draft_vocabulary_only():
    """Vocabulary rows are prefixes smaller than the head's draft vocabulary, labelled with the
    size they ran with; a size at or past the head's own would repeat the full run. Lookup rows
    run the full vocabulary at k_for_vocab."""
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY, trained=True))
    head.set_draft_vocab(torch.tensor([9, 4, 7, 3, 12, 30]))
    rows = evaluate.sweep(
        tiny_backbone(),
        head,
        [[5, 6, 7]],
        ["a"],
        4,
        (),
        ks=[1, 2],
        vocab_sizes=(2, 6, 8),
        k_for_vocab=2,
        lookups=(3,),
        log=lambda m: None,
    )
    assert [(r["k"], r["draft_vocab"], r["lookup"]) for r in rows] == [(1, 6, 0), (2, 6, 0), (2, 2, 0), (2, 6, 3)]
    assert head.draft_vocab.tolist() == [9, 4, 7, 3, 12, 30]  # restored


def test_cli_bench_on_a_tiny_model(tmp_path, capsys):
    write_tiny_folder(tmp_path / "tiny")
    torch.manual_seed(0)
    MTPHead(HeadConfig.for_backbone(TINY, trained=True)).save(tmp_path / "head")
    copy_of_backbone(torch.arange(TINY.vocab_size)).save(tmp_path / "drafter")  # drafts = greedy
    (tmp_path / "eval.jsonl").write_text(
        "".join(json.dumps({"task": t, "prompt": p}) + "\n" for t, p in [("x", "abc"), ("x", "hello"), ("y", "zzz")])
    )
    out = tmp_path / "e2e"
    args = [
        "bench",
        "--model",
        str(tmp_path / "tiny"),
        "--head",
        str(tmp_path / "head"),
        "--eval-set",
        str(tmp_path / "eval.jsonl"),
        "--max-new-tokens",
        "6",
        "--methods",
        "ours_greedy,ours_mtp,ours_mtp_tree,ours_drafter,ours_lookup,ours_mtp_lookup,ours_mtp_lookup_tree,"
        "ours_greedy_int8,ours_mtp_int8,ours_greedy_int8dot,ours_mtp_int8dot,ours_mtp_lookup_int8dot",
        "--lookup",
        "3",
        "--drafter-path",
        str(tmp_path / "drafter"),
        "--lenient",
        "top_k=2",
        "--out",
        str(out),
        "--dtype",
        "float32",
        "--sweep-per-task",
        "1",
        "--plot",
    ]
    assert cli.main(args) == 0
    res = json.loads((tmp_path / "e2e.json").read_text())
    assert set(res["methods"]) == {
        "ours_greedy",
        "ours_mtp",
        "ours_mtp_tree",
        "ours_drafter",
        "ours_lookup",
        "ours_mtp_lookup",
        "ours_mtp_lookup_tree",
        "ours_greedy_int8",
        "ours_mtp_int8",
        "ours_greedy_int8dot",
        "ours_mtp_int8dot",
        "ours_mtp_lookup_int8dot",
        "ours_mtp_lenient(top_k=2,min_ratio=0.0)",
    }
    for m in ("ours_mtp", "ours_mtp_tree", "ours_lookup", "ours_mtp_lookup", "ours_mtp_lookup_tree"):
        assert res["methods"][m]["x"]["identical_to_greedy"] == 2, m
    assert len(res["methods"]["ours_lookup"]["x"]["acceptance_by_position"]) == 3  # --lookup 3
    # MTP on the Q8 backbone equals that backbone's greedy; the Q8 greedy is measured against bf16/fp32.
    assert res["methods"]["ours_mtp_int8"]["x"]["identical_to_greedy"] == 2
    assert 0 <= res["methods"]["ours_greedy_int8"]["x"]["token_agreement"] <= 1
    # ... and with the activations quantized too (integer dot products).
    assert res["methods"]["ours_mtp_int8dot"]["x"]["identical_to_greedy"] == 2
    assert res["methods"]["ours_mtp_lookup_int8dot"]["x"]["identical_to_greedy"] == 2
    assert 0 <= res["methods"]["ours_greedy_int8dot"]["x"]["token_agreement"] <= 1
    drafter = res["methods"]["ours_drafter"]["x"]
    assert drafter["identical_to_greedy"] == 2 and drafter["tau"] > 1  # a perfect drafter is accepted
    # K = 1..5; no vocabulary rows: this head drafts over the whole (tiny) vocabulary; then lookups,
    # then trees (K, branches) beside --lookup
    assert [(r["k"], r["lookup"], r["branches"]) for r in res["sweep"]] == [(k, 0, 1) for k in range(1, 6)] + [
        (3, n, 1) for n in (3, 4, 6, 8, 10)
    ] + [(k, 3, b) for k, b in ((2, 3), (3, 2), (3, 3), (3, 4), (4, 3))]
    assert (tmp_path / "e2e.png").stat().st_size > 1000
    md = (tmp_path / "e2e.md").read_text()
    assert "| y | ours_mtp |" in md and "| y | ours_mtp_lookup_tree |" in md
    assert "*_tree: the head's chain of 3 and its 3 best first drafts" in md


def test_cli_bench_interleaves_the_methods_prompt_by_prompt(tmp_path, capsys, monkeypatch):
    """Every prompt runs through every method before the next prompt (so a drift of the
    machine's speed moves all methods alike), after one untimed warm-up round on prompt 0."""
    from mtp_kernels import evaluate

    write_tiny_folder(tmp_path / "tiny")
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"task": "x", "prompt": p}) + "\n" for p in "abc"))
    calls, run_ours = [], evaluate.run_ours

    def logged(model, ids, tasks, max_new, eos, drafter=None, k=0, lenient=None, lookup=0, branches=1):
        calls.append((ids[0], lookup))
        return run_ours(model, ids, tasks, max_new, eos, drafter, k, lenient, lookup, branches)

    monkeypatch.setattr(evaluate, "run_ours", logged)
    assert (
        cli.main(
            [
                "bench",
                "--model",
                str(tmp_path / "tiny"),
                "--eval-set",
                str(tmp_path / "eval.jsonl"),
                "--max-new-tokens",
                "3",
                "--methods",
                "ours_greedy,ours_lookup",
                "--lookup",
                "2",
                "--dtype",
                "float32",
                "--out",
                str(tmp_path / "e2e"),
            ]
        )
        == 0
    )
    prompts = []
    for c in calls:
        if c[0] not in prompts:
            prompts.append(c[0])
    p0, p1, p2 = prompts
    assert calls == [(p0, 0), (p0, 2), (p0, 0), (p0, 2), (p1, 2), (p1, 0), (p2, 0), (p2, 2)]


def test_cli_bench_bad_input(tmp_path, capsys):
    for extra, msg in [
        (["--methods", "ours_mtp"], "including ours_greedy"),
        (["--methods", "ours_greedy,nope"], "expected a comma-separated subset"),
        (["--eval-set", str(tmp_path / "missing.jsonl")], "cannot read --eval-set"),
        (["--lenient", "top_k=x"], "--lenient expects"),
        (["--per-task", "0"], "--per-task must be >= 1"),
        (["--lookup", "-2"], "--lookup must be >= 0"),
        (["--branches", "0"], "--branches must be >= 1"),
        (["--tree-k", "0"], "--tree-k must be >= 1"),
        (["--methods", "ours_greedy,ours_mtp_lookup_int8dot"], "list both"),
        (["--methods", "ours_greedy,ours_mtp_int8"], "list both"),
        (["--methods", "ours_greedy,ours_mtp_int8dot"], "ours_mtp_int8dot is checked against ours_greedy_int8dot"),
    ]:
        assert cli.main(["bench"] + extra) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err


def test_bench_method_selection(monkeypatch):
    notes = []
    monkeypatch.setattr(evaluate, "llamacpp_available", lambda: False)
    # Not installed: skipped with a note from the default list, a usage error when asked for.
    assert cli.select_methods(None, None, notes.append) == [m for m in cli.ALL_METHODS if m != "llamacpp_greedy"]
    assert len(notes) == 1 and "pip install llama-cpp-python" in notes[0]
    with pytest.raises(cli.UsageError, match="pip install llama-cpp-python"):
        cli.select_methods("ours_greedy,llamacpp_greedy", None, notes.append)
    assert cli.select_methods("ours_greedy,hf_greedy", None, notes.append) == ["ours_greedy", "hf_greedy"]
    # Installed: it runs on a GGUF model (the default one is), never on a safetensors folder.
    monkeypatch.setattr(evaluate, "llamacpp_available", lambda: True)
    assert cli.select_methods(None, None, notes.append) == list(cli.ALL_METHODS)
    assert cli.select_methods("ours_greedy,llamacpp_greedy", "m.gguf", notes.append) == [
        "ours_greedy",
        "llamacpp_greedy",
    ]
    assert "llamacpp_greedy" not in cli.select_methods(None, "folder", notes.append)
    assert len(notes) == 2 and "needs a .gguf model" in notes[1]
    with pytest.raises(cli.UsageError, match="needs a .gguf model"):
        cli.select_methods("ours_greedy,llamacpp_greedy", "folder", notes.append)
    for bad in ["", "ours_mtp", "ours_greedy,nope"]:
        with pytest.raises(cli.UsageError, match="expected a comma-separated subset"):
            cli.select_methods(bad, None, notes.append)


def test_cli_bench_llamacpp_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    assert not evaluate.llamacpp_available()
    assert cli.main(["bench", "--methods", "ours_greedy,llamacpp_greedy"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "pip install llama-cpp-python" in err, err


def test_markdown_ratio_column_against_llamacpp():
    row = {"prompts": 1, "tokens": 9, "tokens_per_s": 30.0, "decode_tokens_per_s": 40.0}
    slow = dict(row, tokens_per_s=15.0, decode_tokens_per_s=0.0)
    md = evaluate.markdown(
        {"command": "c", "setup": "s", "methods": {"ours_greedy": {"a": row}, "llamacpp_greedy": {"a": slow}}}
    )
    assert "x llama.cpp (end to end / decode)" in md
    assert "| a | ours_greedy | 30.0 | 40.0 | 1.00x | 2.00x / n/a |" in md
    assert "| a | llamacpp_greedy | 15.0 | 0.0 | 0.50x | 1.00x / n/a |" in md
    plain = evaluate.markdown({"command": "c", "setup": "s", "methods": {"ours_greedy": {"a": row}}})
    assert "llama.cpp" not in plain and "| a | ours_greedy | 30.0 | 40.0 | 1.00x |  |  |  |  |" in plain


@pytest.mark.skipif(not evaluate.llamacpp_available(), reason="llama-cpp-python (optional) is not installed")
def test_llamacpp_greedy_on_the_default_model(tmp_path):
    from mtp_kernels.models import checkpoint

    try:
        gguf = checkpoint.default_gguf_path()
    except checkpoint.CheckpointError as e:
        pytest.skip(str(e))
    llm = evaluate.load_llamacpp(gguf, threads=1, n_ctx=64)
    prompts = [
        llm.tokenize(f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n".encode(), add_bos=False, special=True)
        for p in ("Hi!", "Name a color.")
    ]
    runs = evaluate.run_llamacpp(llm, prompts, ["x", "y"], 4, (2,))
    for r in runs:
        assert 1 <= len(r.tokens) <= 4 and all(0 <= t < 49152 for t in r.tokens)
        assert r.seconds > 0 and 0 <= r.decode_seconds <= r.seconds
    assert evaluate.run_llamacpp(llm, prompts[:1], ["x"], 4, (2,))[0].tokens == runs[0].tokens  # greedy: repeatable
    # Through `mtp bench`: two prompts, 4 tokens, beside our greedy.
    (tmp_path / "eval.jsonl").write_text(
        "".join(json.dumps({"task": t, "prompt": p}) + "\n" for t, p in [("x", "Hi!"), ("y", "Name a color.")])
    )
    out = tmp_path / "e2e"
    assert (
        cli.main(
            [
                "bench",
                "--eval-set",
                str(tmp_path / "eval.jsonl"),
                "--per-task",
                "1",
                "--max-new-tokens",
                "4",
                "--threads",
                "1",
                "--methods",
                "ours_greedy,llamacpp_greedy",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads((tmp_path / "e2e.json").read_text())
    for row in res["methods"]["llamacpp_greedy"].values():
        assert row["tokens_per_s"] > 0 and row["decode_tokens_per_s"] > 0 and 0 <= row["token_agreement"] <= 1
    assert "x llama.cpp" in (tmp_path / "e2e.md").read_text() and "llama.cpp through llama-cpp-python" in res["setup"]
