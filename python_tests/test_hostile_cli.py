"""`mtp` with hostile arguments, prompts and model files: every
failure is one `mtp: error: ...` line (naming the file, field, FILE:LINE or option) and exit 2,
never a traceback, a hang or minutes of work before the refusal."""

import json
import math
import subprocess
import sys
import time

import pytest
import torch

from mtp_kernels import cli, train
from mtp_kernels.models import checkpoint
from mtp_kernels.models.head import HeadConfig, MTPHead
from test_hostile_loaders import tiny_gguf
from tiny_model import TINY, write_tiny_folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    write_tiny_folder(folder)
    return str(folder)


def fails(capsys, argv, *fragments):
    """cli.main(argv) exits 2 with exactly one `mtp: error:` line holding every fragment (any
    lines before it are notes), and no traceback."""
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own errors (its parser exits)
        rc = e.code
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert rc == 2, (rc, err)
    assert lines and lines[-1].startswith("mtp: error: "), err
    assert all(line.startswith("note:") for line in lines[:-1]), err
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[-1], (f, lines[-1])
    return lines[-1]


def gen(model, *args):
    return ["generate", "--model", model, *args]


# ---- bad model files through `mtp generate` -------------------------------------------------------------------
@pytest.mark.parametrize(
    "meta,field",
    [
        ({"llama__attention__head_count": 0}, "'llama.attention.head_count' = 0"),
        ({"tokenizer__ggml__eos_token_id": 500}, "'tokenizer.ggml.eos_token_id' = 500"),
        ({"tokenizer__chat_template": "{{ oops"}, "'tokenizer.chat_template'"),
        ({"llama__context_length": 2**31 - 1}, "'llama.context_length' = 2147483647"),
        ({"llama__block_count": 0}, "'llama.block_count' = 0"),
    ],
)
def test_bad_gguf_exits_2(tmp_path, capsys, meta, field):
    path = tiny_gguf(tmp_path / "bad.gguf", **meta)
    for extra in ([], ["--dtype", "float32"]):
        fails(capsys, gen(path, "--prompt", "hi", *extra), path, field)


@pytest.mark.parametrize(
    "config,field",
    [
        ({"num_attention_heads": 0}, "num_attention_heads = 0"),
        ({"eos_token_id": 97}, "eos_token_id = 97"),
        ({"max_position_embeddings": 2**40}, "max_position_embeddings = 1099511627776"),
    ],
)
def test_bad_safetensors_config_exits_2(tmp_path, capsys, config, field):
    folder = tmp_path / "m"
    write_tiny_folder(folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **config}))
    fails(capsys, gen(folder, "--prompt", "hi"), "config.json", field)


def _head(tmp_path, vocab=10, **config):
    torch.manual_seed(0)
    head = MTPHead(HeadConfig.for_backbone(TINY, draft_vocab_size=vocab))
    head.set_draft_vocab(torch.arange(40, 40 + vocab))
    head.save(tmp_path / "head")
    cfg = json.loads((tmp_path / "head" / "config.json").read_text())
    (tmp_path / "head" / "config.json").write_text(json.dumps({**cfg, **config}))
    return tmp_path / "head"


def test_bad_head_exits_2(tiny, tmp_path, capsys):
    t = time.perf_counter()
    fails(
        capsys,
        gen(tiny, "--prompt", "hi", "--head", _head(tmp_path, hidden_size=1e7)),
        "config.json",
        "hidden_size = 10000000.0",
    )
    fails(
        capsys,
        gen(tiny, "--prompt", "hi", "--head", _head(tmp_path, hidden_size=10**7)),
        "hidden, kv heads, head dim = (10000000, 2, 16)",
        "does not fit the backbone",
    )
    fails(capsys, gen(tiny, "--prompt", "hi", "--head", _head(tmp_path, kv_layer=7)), "does not fit the backbone")
    assert time.perf_counter() - t < 20  # no head of 10^7 x 2*10^7 built


# ---- options ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args,fragments",
    [
        (["--temperature", "1e300"], ["--temperature", "1e+300"]),
        (["--temperature", "1e-300"], ["--temperature", "1e-300"]),
        (["--temperature", "inf"], ["--temperature"]),
        (["--branches", "3000"], ["--branches must be at most 64"]),
        (["--k", "100000"], ["--k must be at most 64"]),
        (["--lookup", "100"], ["--lookup must be at most 64"]),
        (["--lookup-start", "0"], ["--lookup-start must be >= 1"]),
        (["--lookup-start", "-3"], ["--lookup-start must be >= 1"]),
        (["--draft-confidence", "1.5"], ["--draft-confidence must be a probability in [0, 1], got 1.5"]),
        (["--draft-confidence", "-0.1"], ["--draft-confidence must be a probability in [0, 1]"]),
        (["--draft-confidence", "nan"], ["--draft-confidence must be a probability in [0, 1], got nan"]),
        (["--draft-confidence", "x"], ["argument --draft-confidence: invalid float value: 'x'"]),
        (["--draft-confidence", "0.3", "--no-mtp"], ["--draft-confidence cuts the MTP head's chain"]),
        (["--draft-confidence", "0.3", "--branches", "2"], ["--draft-confidence cuts the MTP head's chain"]),
        (["--draft-confidence", "0.3", "--drafter", "standalone"], ["--draft-confidence cuts the MTP head's chain"]),
        (["--k", "abc"], ["argument --k: invalid int value: 'abc'"]),
        (["--seed", "-1"], ["--seed must be between 0"]),
        (["--seed", str(2**70)], ["--seed must be between 0"]),
        (["--max-new-tokens", str(10**12)], ["--max-new-tokens 1000000000000: the model's context is 256 tokens"]),
        (
            ["--k", "60", "--max-new-tokens", "200"],
            ["--k 60, --lookup 8 and --branches 1 verify up to 61 tokens per pass", "leaves no room for a prompt"],
        ),
        (["--lookup", "40", "--no-mtp", "--max-new-tokens", "220"], ["--lookup 40", "leaves no room for a prompt"]),
        (["--no-mtp", "--max-new-tokens", "255"], ["--max-new-tokens 255 leaves no room for a prompt"]),
        (["--lenient", "top_k=99999999999999999999"], ["--lenient needs top_k >= 1"]),  # a torch cast error before
    ],
)
def test_bad_generate_options(tiny, capsys, args, fragments):
    fails(capsys, gen(tiny, "--prompt", "hi", *args), *fragments)


def test_branches_checked_against_the_head(tiny, tmp_path, capsys):
    head = _head(tmp_path, vocab=10)
    fails(
        capsys,
        gen(tiny, "--prompt", "hi", "--head", head, "--branches", "20"),
        "--branches 20: the head drafts from 10 tokens",
    )
    assert cli.main(gen(tiny, "--prompt", "hi", "--head", str(head), "--branches", "10", "--max-new-tokens", "3")) == 0


# ---- prompts -----------------------------------------------------------------------------------------------------
def test_prompt_not_utf8(tiny, capsys):
    fails(capsys, gen(tiny, "--prompt", "caf\udce9"), "--prompt: byte 0xe9 is not valid UTF-8")
    fails(capsys, gen(tiny, "--prompt", "x\ud800"), "--prompt: unpaired surrogate \\ud800")
    fails(capsys, gen(tiny, "--prompt", ""), "--prompt: the prompt is empty")
    # From a real command line (argv bytes, decoded with surrogateescape by Python).
    r = subprocess.run(
        [sys.executable, "-m", "mtp_kernels.cli", "generate", "--model", tiny, "--prompt", b"caf\xe9"],
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.decode().splitlines() == [
        "mtp: error: --prompt: byte 0xe9 is not valid UTF-8 (at character 3)"
    ], r.stderr


@pytest.mark.parametrize(
    "content,fragment",
    [
        (b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n', "p.jsonl:2: byte 0xe9 is not valid UTF-8"),
        (
            b'{"prompt": "ok"}\n\n' + b"[" * 100000 + b"]" * 100000 + b"\n",
            "p.jsonl:3: not valid JSON (nested too deep)",
        ),
        (b'{"prompt": "a\\ud800"}\n', "p.jsonl:1: unpaired surrogate \\ud800"),
        (b'{"prompt": 5}\n', 'p.jsonl:1: expected an object with a string "prompt"'),
        (b'{"prompt": "ok"}\n{"prompt": ""}\n', "p.jsonl:2: the prompt is empty"),
    ],
)
def test_bad_prompts_files(tiny, tmp_path, capsys, content, fragment):
    (tmp_path / "p.jsonl").write_bytes(content)
    fails(capsys, gen(tiny, "--prompts-file", tmp_path / "p.jsonl"), fragment)


def test_huge_prompt_refused_before_tokenizing(tiny, tmp_path, capsys):
    """A byte-level BPE token covers at most its own bytes (5 here): 51 MB cannot fit 256 tokens."""
    model = tiny_gguf(tmp_path / "bpe.gguf")
    assert checkpoint.load(model)[2].max_token_bytes == 5
    (tmp_path / "p.jsonl").write_text(
        json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"prompt": "ab " * 17_000_000}) + "\n"
    )
    t = time.perf_counter()
    fails(
        capsys,
        gen(model, "--prompts-file", tmp_path / "p.jsonl"),
        "p.jsonl:2: the prompt (51000000 bytes",
        "does not fit the model's context of 256 tokens",
    )
    assert time.perf_counter() - t < 15  # tokenizing 51 MB took about a minute
    # A WordLevel vocabulary's unknown token may cover a whole word: no byte bound there (it
    # could refuse a prompt that fits); the token count still decides.
    assert checkpoint.load(tiny)[2].max_token_bytes is None
    fails(capsys, gen(tiny, "--prompt", "a" * 300), "--prompt: the prompt (300 tokens")


def test_prompts_file_is_a_folder(tiny, tmp_path, capsys):
    fails(capsys, gen(tiny, "--prompts-file", tmp_path), "cannot read --prompts-file")


def test_unexpected_errors_are_one_line(tiny, capsys, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("boom\n  second line")

    monkeypatch.setattr(cli, "load_backbone", boom)
    fails(capsys, gen(tiny, "--prompt", "hi"), "internal error: RuntimeError: boom second line")


# ---- mtp bench (refused before loading anything) --------------------------------------------------------------
def test_bad_bench_input(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(checkpoint, "load", lambda *a, **k: pytest.fail("loaded a model for a bad command"))
    fails(capsys, ["bench", "--threads", "100000"], "--threads must be at most 256")
    (tmp_path / "e.jsonl").write_bytes(b"[" * 100000 + b"]" * 100000 + b"\n")
    fails(
        capsys, ["bench", "--eval-set", tmp_path / "e.jsonl"], "cannot read --eval-set", "e.jsonl:1:", "nested too deep"
    )
    (tmp_path / "e.jsonl").write_text(json.dumps({"prompt": "x"}) + "\n")
    fails(capsys, ["bench", "--eval-set", tmp_path / "e.jsonl"], "row 1", 'a string "task"')


# ---- mtp train ---------------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_train(tiny, tmp_path, monkeypatch):
    """`mtp train` on the tiny model (checkpoint.load patched): (prompts writer, base argv)."""
    loaded = checkpoint.load(tiny)
    monkeypatch.setattr(checkpoint, "load", lambda *a, **k: loaded)

    def prompts(n):
        (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": f"prompt {c}"}) + "\n" for c in "abcdef"[:n]))
        return str(tmp_path / "p.jsonl")

    base = [
        "train",
        "--out",
        str(tmp_path / "out"),
        "--work-dir",
        str(tmp_path / "work"),
        "--max-new-tokens",
        "6",
        "--max-steps",
        "3",
        "--batch",
        "2",
    ]
    return prompts, base


@pytest.mark.parametrize("drafter", ["head", "standalone"])
def test_train_tiny_data(tiny_train, tmp_path, capsys, monkeypatch, drafter):
    prompts, base = tiny_train
    base = base + ["--drafter", drafter]
    distill = train.distill
    monkeypatch.setattr(train, "distill", lambda *a, **k: pytest.fail("distilled for a refused run"))
    for n in (0, 1):  # looped forever with 1 prompt (the only one held out for validation)
        fails(capsys, base + ["--prompts", prompts(n)], "p.jsonl", "at least 2 prompts", f"got {n}")
    fails(capsys, base + ["--prompts", prompts(6), "--num-prompts", "1"], "at least 2 prompts", "--num-prompts")
    monkeypatch.setattr(train, "distill", distill)
    t = time.perf_counter()
    assert cli.main(base + ["--prompts", prompts(2)]) == 0
    assert time.perf_counter() - t < 120
    result = json.loads((tmp_path / "out" / "training.json").read_text())
    assert result["steps"] == 3 and result["sequences"] == 1 and result["val_sequences"] == 1


def test_train_blocks(tiny_train, tmp_path, monkeypatch):
    """--blocks N trains a head of N dense blocks, saved as such (each block starts as the
    layer the head reads); with --drafter standalone the drafter is sized to that head."""
    from mtp_kernels import train_drafter

    prompts, base = tiny_train
    params, sized_to = {}, {}
    near = train_drafter.config_near
    for n in (1, 2):
        assert cli.main(base + ["--prompts", prompts(2), "--blocks", str(n), "--out", str(tmp_path / f"h{n}")]) == 0
        assert json.loads((tmp_path / f"h{n}" / "config.json").read_text())["num_blocks"] == n
        params[n] = json.loads((tmp_path / f"h{n}" / "training.json").read_text())["head_parameters"]

        def sized(vocab_len, max_position, head_params, n=n):  # the head size the drafter is sized to
            sized_to[n] = head_params
            return near(vocab_len, max_position, head_params)

        monkeypatch.setattr(train_drafter, "config_near", sized)
        argv = base + [
            "--prompts",
            prompts(2),
            "--drafter",
            "standalone",
            "--blocks",
            str(n),
            "--out",
            str(tmp_path / f"d{n}"),
        ]
        assert cli.main(argv) == 0
    assert params[2] > params[1] and sized_to == params


def test_train_kv_layer_and_options_checked_before_any_work(tiny_train, capsys, monkeypatch):
    prompts, base = tiny_train
    monkeypatch.setattr(train, "distill", lambda *a, **k: pytest.fail("distilled for a refused run"))
    for layer in ("99", "2", "-3"):  # 99 trained layer 99 % 30 before
        fails(
            capsys,
            base + ["--prompts", prompts(4), "--kv-layer", layer],
            f"--kv-layer {layer} is out of range",
            "2 layers",
        )
    monkeypatch.setattr(checkpoint, "load", lambda *a, **k: pytest.fail("loaded a model for a bad command"))
    for args, fragment in [
        (["--minutes", "nan"], "--minutes must be a finite positive number"),
        (["--minutes", "0"], "--minutes"),
        (["--minutes", "inf"], "--minutes"),
        (["--lr", "nan"], "--lr must be a finite positive number"),
        (["--lr", "-1"], "--lr"),
        (["--unroll", "1000"], "--unroll must be at most 64"),
        (["--seed", "-5"], "--seed"),
        (["--draft-vocab", "0"], "--draft-vocab must be >= 1"),
        (["--blocks", "0"], "--blocks 0: the head has 1 to 64 dense blocks"),
        (["--blocks", "65"], "--blocks 65: the head has 1 to 64"),
        (["--drafter", "standalone", "--blocks", "0"], "--blocks 0: the head has 1 to 64"),
    ]:
        fails(capsys, base + ["--prompts", prompts(4), *args], fragment)


@pytest.mark.parametrize(
    "content,fragment",
    [
        (b'{"prompt": "ok"}\n\n{"prompt": "caf\xe9"}\n', "p.jsonl:3: not valid UTF-8"),
        (
            b'{"prompt": "ok"}\n\n\n' + b"[" * 100000 + b"]" * 100000 + b"\n",
            "p.jsonl:4: not valid JSON (nested too deep)",
        ),
        # the prompt's line, not its index among the non-blank lines (blank lines and a BOM before it)
        (
            b'\xef\xbb\xbf{"prompt": "ok"}\n\n5\n{"prompt": "x"}\n',
            'p.jsonl:3: expected JSON lines with a string "prompt"',
        ),
        (b'{"prompt": "ok"}\r\n\r\n{"prompt": "a\\ud800"}\r\n', "p.jsonl:3: prompt 2: an unpaired surrogate"),
        (b'{"prompt": "ok"}\n\n{"prompt": ""}\n', "p.jsonl:3: prompt 2 plus --max-new-tokens 6 does not fit"),
        (b'{"prompt": "ok"}\n\n{"prompt": "' + b"a " * 300 + b'"}\n', "p.jsonl:3: prompt 2 plus --max-new-tokens"),
    ],
)
def test_train_prompts_file_errors_name_file_line(tiny_train, tmp_path, capsys, monkeypatch, content, fragment):
    _, base = tiny_train
    monkeypatch.setattr(train, "distill", lambda *a, **k: pytest.fail("distilled for a refused run"))
    (tmp_path / "p.jsonl").write_bytes(content)
    fails(capsys, base + ["--prompts", tmp_path / "p.jsonl"], fragment)


def test_train_head_refuses_empty_sets():
    """train_head looped forever over zero batches; now a ValueError at once."""
    from tiny_model import tiny_backbone

    model = tiny_backbone()
    head = MTPHead(HeadConfig.for_backbone(TINY))
    seq = train.sequence_from_backbone(model, [5, 6, 7, 8, 9], 3, -1)
    for tr, val in (([], [seq]), ([seq], [])):
        with pytest.raises(ValueError, match="at least one training and one validation sequence"):
            train.train_head(head, model, tr, val, train.TrainConfig(max_steps=2))
    with pytest.raises(ValueError, match="at least 2 prompts"):
        train.split([1])
    assert math.isfinite(train.train_head(head, model, [seq], [seq], train.TrainConfig(max_steps=2))["last_loss"])


def test_misfit_drafter_and_work_dir(tiny, tmp_path, capsys):
    from mtp_kernels.models.drafter import StandaloneDrafter, default_config

    StandaloneDrafter(
        default_config(3, 256, hidden_size=32, intermediate_size=48, num_heads=2, num_kv_heads=1, head_dim=16),
        torch.tensor([1, 2, 500]),
    ).save(tmp_path / "d")
    fails(
        capsys,
        gen(tiny, "--prompt", "hi", "--drafter", "standalone", "--drafter-path", tmp_path / "d"),
        str(tmp_path / "d"),
        "token id 500, outside the backbone's vocabulary of 97",
    )
    (tmp_path / "afile").write_text("x")
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    fails(capsys, ["train", "--prompts", tmp_path / "p.jsonl", "--work-dir", tmp_path / "afile"], "afile")


def test_prompts_file_with_bom_and_crlf(tiny, tmp_path, capsys):
    (tmp_path / "p.jsonl").write_bytes(b'\xef\xbb\xbf{"prompt": "abc"}\r\n{"prompt": "de"}\r\n')
    assert cli.main(gen(tiny, "--prompts-file", str(tmp_path / "p.jsonl"), "--max-new-tokens", "2", "--json")) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
