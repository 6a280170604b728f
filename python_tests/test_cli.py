"""The `mtp` command on a tiny model folder: output, JSON, and clear errors with exit 2."""

import json
import subprocess
import sys

import pytest

from tiny_model import write_tiny_folder


def mtp(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "mtp_kernels.cli", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    write_tiny_folder(folder)
    return folder


def test_generate_json_mtp_equals_no_mtp(tiny, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello"}\n\n{"prompt": "abcabc"}\n')
    runs = {}
    for flag in ([], ["--no-mtp"]):
        r = mtp(
            "generate", "--model", tiny, "--prompts-file", prompts, "--max-new-tokens", 6, "--k", 2, "--json", *flag
        )
        assert r.returncode == 0, r.stderr
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        assert len(rows) == 2 and all(set(row) >= {"tokens", "text", "passes", "seconds"} for row in rows)
        runs[bool(flag)] = rows
    assert [r["tokens"] for r in runs[False]] == [r["tokens"] for r in runs[True]]
    assert all(1 <= len(r["tokens"]) <= 6 for r in runs[True])
    assert "UNTRAINED" in mtp("generate", "--model", tiny, "--prompt", "hi", "--max-new-tokens", 2).stderr


def test_sampled_generate_mtp_equals_no_mtp_for_the_same_seed(tiny):
    runs = {}
    for seed in (1, 2):
        for flag in ([], ["--no-mtp"]):
            r = mtp(
                "generate",
                "--model",
                tiny,
                "--prompt",
                "hello",
                "--max-new-tokens",
                8,
                "--k",
                2,
                "--json",
                "--temperature",
                1.0,
                "--seed",
                seed,
                *flag,
            )
            assert r.returncode == 0, r.stderr
            runs[seed, bool(flag)] = json.loads(r.stdout)["tokens"]
    assert runs[1, False] == runs[1, True] and runs[2, False] == runs[2, True]
    assert runs[1, True] != runs[2, True]


def test_sampling_hot_over_narrow_passes_is_lookup_alone_unless_asked(tiny):
    """Over narrow passes (--dtype float32) at --temperature 0.8: prompt lookup alone by default
    (the log says why), the head's drafts with --k; the same tokens as --no-mtp either way."""
    runs = {}
    for flags in ([], ["--k", 2], ["--no-mtp"]):
        r = mtp(
            "generate", "--model", tiny, "--dtype", "float32", "--prompt", "hello", "--max-new-tokens", 8,
            "--temperature", 0.8, "--seed", 5, "--json", *flags,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        runs[tuple(flags)] = (json.loads(r.stdout), r.stderr)
    assert (
        "prompt lookup of 3 drafts, up to 8 for a longer match (the MTP head's drafts do not pay from "
        "temperature 0.5 here; --k drafts with it)" in runs[()][1]
    )
    assert "MTP, K=2" in runs[("--k", 2)][1]
    assert len({tuple(out["tokens"]) for out, _ in runs.values()}) == 1


def test_sampling_hot_over_narrow_passes_does_not_load_the_head(tiny, tmp_path, monkeypatch, capsys):
    """Where the default leaves the MTP head out, `mtp generate` does not load it (memory, time);
    --k brings it back, and a --head named is still loaded (its errors are the user's to see)."""
    from mtp_kernels import cli
    from mtp_kernels.models import loading

    calls = []

    def counting(*a, **kw):
        calls.append(a[0])
        return loading.load_head(*a, **kw)

    monkeypatch.setattr(cli, "load_head", counting)
    base = ["generate", "--model", str(tiny), "--dtype", "float32", "--prompt", "abcabc", "--max-new-tokens", "6"]
    hot = ["--temperature", "0.8", "--seed", "2"]
    loads = []
    for flags in (hot, [*hot, "--k", "2"], []):  # left out; asked for; greedy
        calls.clear()
        assert cli.main([*base, "--json", *flags]) == 0
        out = json.loads(capsys.readouterr().out)
        loads.append(len(calls))
        if flags == hot:
            assert out["drafted_by_position"][0] > 0  # prompt lookup still drafts
    assert loads == [0, 1, 1]
    bad = str(tmp_path / "no-such-head")
    assert cli.main([*base, "--temperature", "0.8", "--head", bad]) == 2
    assert bad in capsys.readouterr().err


def test_lookup_generate_equals_no_mtp(tiny):
    runs = {}
    for flags in (["--lookup", 4], ["--lookup", 4, "--no-mtp"], ["--no-mtp"]):
        r = mtp("generate", "--model", tiny, "--prompt", "abcabcabc", "--max-new-tokens", 12, "--json", *flags)
        assert r.returncode == 0, r.stderr
        runs[tuple(flags)] = json.loads(r.stdout)
    assert (
        "prompt lookup of 3 drafts, up to 4 for a longer match"
        in mtp("generate", "--model", tiny, "--prompt", "ab", "--max-new-tokens", 2, "--lookup", 4).stderr
    )
    assert (
        "prompt lookup up to 2"
        in mtp("generate", "--model", tiny, "--prompt", "ab", "--max-new-tokens", 2, "--lookup", 2).stderr
    )
    # On by default beside the MTP head (config.default_lookup: 3 growing to 8 with a longer
    # match where each row of a pass costs, here fp32; 6 on the bf16 backbone), off with
    # --lookup 0 and in plain greedy.
    narrow = "prompt lookup of 3 drafts, up to 8 for a longer match"
    assert narrow in mtp("generate", "--model", tiny, "--prompt", "ab", "--max-new-tokens", 2).stderr
    assert (
        "prompt lookup of 2 drafts, up to 4 for a longer match"
        in mtp(
            "generate", "--model", tiny, "--prompt", "ab", "--max-new-tokens", 2, "--lookup", 4, "--lookup-start", 2
        ).stderr
    )
    bf16 = mtp("generate", "--model", tiny, "--prompt", "ab", "--max-new-tokens", 2, "--dtype", "bfloat16")
    assert "prompt lookup up to 6" in bf16.stderr, bf16.stderr
    assert "chain cut" not in bf16.stderr  # wide passes: every draft verified
    cut = mtp("generate", "--model", tiny, "--prompt", "ab", "--max-new-tokens", 2, "--draft-confidence", "0.4")
    assert "the chain cut below a probability of 0.4" in cut.stderr, cut.stderr
    for flags in (["--lookup", 0], ["--no-mtp"]):
        r = mtp("generate", "--model", tiny, "--prompt", "ab", "--max-new-tokens", 2, *flags)
        assert r.returncode == 0 and "prompt lookup" not in r.stderr, r.stderr
    tokens = {k: v["tokens"] for k, v in runs.items()}
    assert len(set(map(tuple, tokens.values()))) == 1
    assert len(runs[("--lookup", 4, "--no-mtp")]["drafted_by_position"]) == 4


def test_tree_drafts_by_default_in_greedy_bf16(tiny):
    """`mtp generate` verifies trees (the head's chain of 3 and its 2nd and 3rd best first drafts)
    by default in greedy mode on the bf16 backbone; chains of 2 with --branches 1, in fp32,
    with Q8 weights or where trees do not go; the tokens are --no-mtp's either way."""
    runs = {}
    for flags in ([], ["--branches", 1], ["--branches", 4, "--k", 1], ["--no-mtp"]):
        r = mtp(
            "generate",
            "--model",
            tiny,
            "--prompt",
            "abcab",
            "--max-new-tokens",
            10,
            "--json",
            "--dtype",
            "bfloat16",
            *flags,
        )
        assert r.returncode == 0, r.stderr
        runs[tuple(flags)] = json.loads(r.stdout)
        runs[tuple(flags)]["stderr"] = r.stderr
    assert "MTP, K=3, 3 first drafts per head pass" in runs[()]["stderr"]
    assert "MTP, K=2, prompt lookup" in runs[("--branches", 1)]["stderr"]
    assert "MTP, K=1, 4 first drafts per head pass" in runs[("--branches", 4, "--k", 1)]["stderr"]
    assert len({tuple(r["tokens"]) for r in runs.values()}) == 1
    assert runs[()]["leaves_accepted"] >= 0 and "leaves_accepted" in runs[("--branches", 1)]
    for flags in (["--temperature", 0.25], ["--dtype", "float32"], ["--dtype", "bfloat16", "--int8"]):
        r = mtp("generate", "--model", tiny, "--prompt", "ab", "--max-new-tokens", 2, *flags)
        assert r.returncode == 0 and "MTP, K=2," in r.stderr and "first drafts" not in r.stderr, (flags, r.stderr)
    r = mtp("generate", "--model", tiny, "--prompt", "ab", "--max-new-tokens", 2, "--branches", 2)  # fp32 on request
    assert r.returncode == 0 and "MTP, K=3, 2 first drafts per head pass" in r.stderr
    assert "passes won by another first draft (a leaf)" in r.stderr


def test_int8_dot_generate_mtp_equals_no_mtp(tiny):
    runs = {}
    for flag in ([], ["--no-mtp"]):
        r = mtp(
            "generate",
            "--model",
            tiny,
            "--prompt",
            "hello",
            "--max-new-tokens",
            8,
            "--k",
            2,
            "--json",
            "--int8",
            "--int8-dot",
            *flag,
        )
        assert r.returncode == 0, r.stderr
        assert "int8 weights and activations" in r.stderr
        runs[bool(flag)] = json.loads(r.stdout)["tokens"]
    assert runs[False] == runs[True]


def test_generate_streams_text_and_stats(tiny):
    r = mtp("generate", "--model", tiny, "--prompt", "abc", "--max-new-tokens", 4, "--no-mtp")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "tokens/s" in r.stderr and "backbone passes" in r.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", "/nonexistent/model.gguf", "--prompt", "x"], "no model at"),
        (["--prompt", "a" * 300], "does not fit the model's context of 256 tokens"),
        (["--prompt", "x", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        (["--prompt", "x", "--k", "0"], "--k must be >= 1"),
        (["--prompt", "x", "--temperature", "-1"], "--temperature must be finite and >= 0"),
        (["--prompt", "x", "--temperature", "nan"], "--temperature must be finite and >= 0"),
        (["--prompts-file", "/nonexistent.jsonl"], "cannot read --prompts-file"),
        (["--prompt", "x", "--lenient", "3"], "--lenient expects top_k=K[,min_ratio=R], got '3'"),
        (["--prompt", "x", "--lenient", "top_k=2,ratio=0.5"], "--lenient expects top_k=K[,min_ratio=R]"),
        (["--prompt", "x", "--lenient", "top_k=two"], "with an integer K and a number R, got 'top_k=two'"),
        (["--prompt", "x", "--lenient", "top_k=0"], "--lenient needs top_k >= 1 and min_ratio in [0, 1]"),
        (["--prompt", "x", "--lenient", "top_k=2,min_ratio=1.5"], "--lenient needs top_k >= 1 and min_ratio in [0, 1]"),
        (["--prompt", "x", "--lenient", "top_k=2", "--temperature", "1"], "--lenient is a greedy mode"),
        (["--prompt", "x", "--int8-dot"], "--int8-dot quantizes the activations for int8 weights: use it with --int8"),
        (["--prompt", "x", "--lookup", "-1"], "--lookup must be >= 0"),
        (
            ["--prompt", "x", "--lookup", "2", "--drafter", "standalone"],
            "--lookup drafts go with the MTP head or alone",
        ),
        (["--prompt", "x", "--branches", "0"], "--branches must be >= 1"),
        (
            ["--prompt", "x", "--branches", "2", "--temperature", "1"],
            "--branches > 1 (tree drafts) needs the MTP head in greedy mode",
        ),
        (["--prompt", "x", "--branches", "2", "--no-mtp"], "--branches > 1 (tree drafts) needs the MTP head"),
        (["--prompt", "x", "--branches", "2", "--drafter", "standalone"], "--branches > 1 (tree drafts) needs the MTP"),
        (
            ["--prompt", "x", "--branches", "3", "--lenient", "top_k=2"],
            "--branches > 1 (tree drafts) needs the MTP head",
        ),
    ],
)
def test_bad_input_exits_2_with_a_message(tiny, args, message):
    if "--model" not in args:
        args = ["--model", str(tiny), *args]
    r = mtp("generate", *args)
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    if "--lenient" in args:  # rejected before anything loads: the one line
        assert r.stderr.strip().splitlines() == [f"mtp: error: {r.stderr.split('mtp: error: ')[1].strip()}"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--prompt-anchors", "-1"], "--prompt-anchors must be >= 0"),
        (["--prompt-anchors", "4", "--drafter", "standalone"], "--prompt-anchors trains the head"),
        (["--soft-targets", "1.5"], "--soft-targets must be between 0 and 1"),
        (["--soft-targets", "-0.1"], "--soft-targets must be between 0 and 1"),
        (["--soft-targets", "nan"], "--soft-targets must be between 0 and 1"),
        (["--soft-targets", "0.5", "--drafter", "standalone"], "--soft-targets trains the head"),
        (["--max-steps", "0"], "--max-steps must be >= 1"),
    ],
)
def test_bad_train_options_exit_2(args, message):
    r = mtp("train", *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, (r.returncode, r.stderr)


def test_lenient_generate(tiny):
    """top_k=1 is exactly greedy; a looser setting runs and says it is not lossless."""
    runs = {}
    for flag in ([], ["--lenient", "top_k=1"], ["--lenient", "top_k=5,min_ratio=0.1"]):
        r = mtp("generate", "--model", tiny, "--prompt", "hello", "--max-new-tokens", 8, "--k", 2, "--json", *flag)
        assert r.returncode == 0, r.stderr
        runs[tuple(flag)] = json.loads(r.stdout)["tokens"]
    assert runs[()] == runs[("--lenient", "top_k=1")]
    assert 1 <= len(runs[("--lenient", "top_k=5,min_ratio=0.1")]) <= 8
    r = mtp("generate", "--model", tiny, "--prompt", "hi", "--max-new-tokens", 2, "--lenient", "top_k=2")
    assert "not lossless" in r.stderr


def test_bad_prompts_files(tiny, tmp_path):
    for content, message in [
        ('{"prompt": "ok"}\n{oops\n', "p.jsonl:2: not valid JSON"),
        ('{"text": "x"}\n', 'p.jsonl:1: expected an object with a string "prompt"'),
        ("\n\n", "no prompts"),
    ]:
        (tmp_path / "p.jsonl").write_text(content)
        r = mtp("generate", "--model", tiny, "--prompts-file", tmp_path / "p.jsonl")
        assert r.returncode == 2 and message in r.stderr, r.stderr


def test_usage_errors():
    assert mtp().returncode == 2
    r = mtp("generate", "--prompt", "x", "--prompts-file", "y")
    assert r.returncode == 2 and "not allowed with" in r.stderr


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--dtype", "bfloat16"],
        ["--dtype", "float32"],
        ["--dtype", "bfloat16", "--int8"],
        ["--temperature", "1", "--seed", "3"],
        ["--no-mtp"],
        ["--lookup", "0"],
        ["--lookup-start", "1"],
        ["--draft-confidence", "0"],
        ["--draft-confidence", "0.05"],
    ],
)
def test_same_call_same_behaviour_as_the_library(tiny, flags, capsys):
    """`mtp generate` and decoding.generate with k, branches and lookup left out, on the same
    backbone and head (models.loading), decode alike: same tokens, passes and acceptance
    (config.DecodeConfig.resolve is the one place the defaults live)."""
    from mtp_kernels import cli, decoding
    from mtp_kernels.config import NARROW_DRAFT_CONFIDENCE, DecodeConfig
    from mtp_kernels.models.loading import load_backbone, load_head

    assert (
        cli.main(["generate", "--model", str(tiny), "--prompt", "abcabcab", "--max-new-tokens", "12", "--json", *flags])
        == 0
    )
    want = json.loads(capsys.readouterr().out)
    opts = dict(zip(flags[::2], flags[1::2])) if "--no-mtp" not in flags else {}  # "--int8" is a switch: left out
    cfg, model, tok, _ = load_backbone(str(tiny), opts.get("--dtype"), print, int8="--int8" in flags)
    head = None if "--no-mtp" in flags else load_head(None, model, lambda m: None, default_model=False)
    kwargs = dict(temperature=float(opts.get("--temperature", 0)), seed=int(opts.get("--seed", 0)))
    if "--lookup" in opts:
        kwargs["lookup"] = int(opts["--lookup"])
    if "--lookup-start" in opts:
        kwargs["lookup_start"] = int(opts["--lookup-start"])
    if "--draft-confidence" in opts:
        kwargs["draft_confidence"] = float(opts["--draft-confidence"])
    ids = tok.encode(tok.apply_chat_template("abcabcab"))
    got = decoding.generate(model, [ids], 12, head=head, eos_token_ids=tuple(cfg.eos_token_ids), **kwargs)[0]
    assert (got.tokens, got.passes, got.accepted, got.drafted, got.leaves_accepted) == (
        want["tokens"],
        want["passes"],
        want["accepted_by_position"],
        want["drafted_by_position"],
        want["leaves_accepted"],
    )
    # What both resolved: trees only on the bf16 backbone dequantized on request, greedy; no
    # drafts when sampling hot over narrow passes with nothing asked for.
    resolved = DecodeConfig.resolve(model, head, **kwargs)
    trees = flags == ["--dtype", "bfloat16"]
    if flags == ["--temperature", "1", "--seed", "3"]:  # the head left out: prompt lookup alone
        assert (resolved.k, resolved.lookup, resolved.lookup_start, resolved.draft_confidence) == (0, 8, 3, 0)
        return
    assert (resolved.k, resolved.branches) == ((3, 3) if trees else (2, 1))
    assert resolved.lookup == (
        int(opts["--lookup"]) if "--lookup" in opts else 0 if head is None else 6 if trees else 8
    )
    assert resolved.lookup_start == (
        int(opts["--lookup-start"]) if "--lookup-start" in opts else min(resolved.lookup, 6 if trees else 3)
    )
    assert resolved.draft_confidence == (
        float(opts["--draft-confidence"])
        if "--draft-confidence" in opts
        else 0
        if head is None or trees
        else NARROW_DRAFT_CONFIDENCE
    )
