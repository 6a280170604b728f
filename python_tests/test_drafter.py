"""The standalone drafter: exact speculative output through its own cache and prefill,
save/load, its size against the head's, and its differentiable training forward."""

import dataclasses

import pytest
import torch

from mtp_kernels import cli, decoding, train, train_drafter
from mtp_kernels.models import loading
from mtp_kernels.models.checkpoint import CheckpointError
from mtp_kernels.models.config import LlamaConfig
from mtp_kernels.models.drafter import StandaloneDrafter, config_near, default_config, parameter_counts
from mtp_kernels.models.head import HeadConfig
from tiny_model import TINY, tiny_backbone, tiny_weights, write_tiny_folder

SMOLLM2 = LlamaConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    max_position=8192,
)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11], list(range(20, 50)), [60] * 7]


def small_drafter(vocab=torch.arange(4, 90), seed=0):
    return StandaloneDrafter(
        default_config(
            len(vocab),
            TINY.max_position,
            hidden_size=32,
            intermediate_size=48,
            num_heads=2,
            num_kv_heads=1,
            head_dim=16,
        ),
        vocab,
        seed=seed,
    )


def copy_of_backbone(vocab):
    """A drafter that is the tiny backbone itself (plus an UNK row): over the full
    vocabulary its drafts are exactly the backbone's greedy tokens."""
    cfg = dataclasses.replace(TINY, vocab_size=len(vocab) + 1)
    w = tiny_weights()
    emb = w["model.embed_tokens.weight"]
    w["model.embed_tokens.weight"] = torch.cat([emb[vocab], torch.zeros(1, TINY.hidden_size)])
    return StandaloneDrafter(cfg, vocab, w)


def greedy(model, prompts, max_new):
    return [g.tokens for g in decoding.generate(model, prompts, max_new)]


def check_stats(gens, perfect=False):
    for g in gens:  # no EOS: every pass commits its accepted drafts + one token
        assert len(g.tokens) - 1 == g.passes + sum(g.accepted)
        assert all(a <= d for a, d in zip(g.accepted, g.drafted))
        assert all(a1 <= a0 for a0, a1 in zip(g.accepted, g.accepted[1:]))
        if perfect:
            assert g.accepted == g.drafted


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["random", "perfect", "partial"])
def test_speculative_with_the_drafter_equals_greedy(k, batch, kind):
    model = tiny_backbone()
    if kind == "random":
        drafter = small_drafter()
    else:  # "partial": the backbone without some tokens, so it drafts wrong and rolls back
        vocab = torch.arange(TINY.vocab_size) if kind == "perfect" else torch.arange(0, TINY.vocab_size, 3)
        drafter = copy_of_backbone(vocab)
    max_new = 20
    for start in range(0, len(PROMPTS), batch):
        prompts = PROMPTS[start : start + batch]
        got = decoding.generate(model, prompts, max_new, head=drafter, k=k)
        assert [g.tokens for g in got] == greedy(model, prompts, max_new)
        check_stats(got, perfect=kind == "perfect")
        if kind == "perfect":
            assert all(sum(g.accepted) > 0 and g.passes < max_new - 1 for g in got)
    assert drafter.cache.lens.shape[0] == len(prompts)


def test_bfloat16_and_sampled_generation_stay_exact():
    model = tiny_backbone(torch.bfloat16)
    drafter = small_drafter().to(torch.bfloat16)
    got = decoding.generate(model, PROMPTS, 12, head=drafter, k=3)
    assert [g.tokens for g in got] == greedy(model, PROMPTS, 12)
    sampled = decoding.generate(model, PROMPTS, 12, head=drafter, k=2, temperature=1.0, seed=4)
    assert [g.tokens for g in sampled] == [
        g.tokens for g in decoding.generate(model, PROMPTS, 12, temperature=1.0, seed=4)
    ]


def test_drafter_rolls_its_cache_back_to_the_committed_prefix():
    model = tiny_backbone()
    drafter = copy_of_backbone(torch.arange(0, TINY.vocab_size, 2))
    cache = model.new_cache(2, 64)
    for b, p in enumerate(PROMPTS[:2]):
        model(torch.tensor([p]), cache.select(b))
    drafter.begin(PROMPTS[:2], 64)
    assert drafter.cache.lens.tolist() == [5, 2]
    drafts = drafter.draft(model, cache, None, torch.tensor([12, 14]), 3)
    assert drafts.shape == (2, 3) and drafts.dtype == torch.int64 and (drafts % 2 == 0).all()
    assert drafter.cache.lens.tolist() == [5 + 3, 2 + 3]  # token + 2 drafts fed; the last is not
    cache.lens += torch.tensor([3, 1])  # request 0 accepted 2 drafts, request 1 none
    drafter.draft(model, cache, None, torch.tensor([16, 18]), 2)
    assert drafter.cache.lens.tolist() == [8 + 2, 3 + 2]
    assert drafter.seq[1][:4] == [10, 11, 14, 18]
    cache.lens[1] = 50
    with pytest.raises(RuntimeError, match="more than this drafter saw"):
        drafter.draft(model, cache, None, torch.tensor([16, 18]), 2)


def test_save_load_and_bad_folders(tmp_path):
    drafter = small_drafter(seed=3)
    drafter.save(tmp_path / "d")
    loaded = StandaloneDrafter.load(tmp_path / "d")
    assert loaded.cfg == drafter.cfg and torch.equal(loaded.vocab, drafter.vocab) and not loaded.trained
    assert all(torch.equal(loaded.weights[n], w) for n, w in drafter.weights.items())
    model = tiny_backbone()
    a = decoding.generate(model, PROMPTS[:2], 8, head=drafter, k=2)
    b = decoding.generate(model, PROMPTS[:2], 8, head=loaded, k=2)
    assert [g.accepted for g in a] == [g.accepted for g in b]
    with pytest.raises(CheckpointError, match="not a standalone drafter"):
        StandaloneDrafter.load(tmp_path / "missing")
    (tmp_path / "d" / "drafter.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="not a standalone drafter"):
        StandaloneDrafter.load(tmp_path / "d")
    (tmp_path / "d" / "config.json").write_text('{"kind": "something else"}')
    with pytest.raises(CheckpointError, match="not a standalone drafter"):
        StandaloneDrafter.load(tmp_path / "d")
    other = small_drafter(vocab=torch.arange(10, 20))
    other.save(tmp_path / "e")
    drafter.save(tmp_path / "f")
    (tmp_path / "e" / "drafter.safetensors").replace(tmp_path / "f" / "drafter.safetensors")
    with pytest.raises(CheckpointError, match="has shape"):
        StandaloneDrafter.load(tmp_path / "f")
    with pytest.raises(ValueError, match="outside the backbone's vocabulary"):
        small_drafter(vocab=torch.tensor([1, 200])).check_fits(TINY)


def test_default_drafter_is_within_25_percent_of_the_head():
    counts = parameter_counts(default_config(8192, SMOLLM2.max_position), HeadConfig.for_backbone(SMOLLM2))
    assert counts["drafter"] == 3_671_552 and counts["head"] == 4_205_376
    assert 0.75 <= counts["ratio"] <= 1.25
    assert StandaloneDrafter.create(torch.arange(8192), 64).num_parameters() == counts["drafter"]


def test_drafter_for_a_larger_head_stays_within_25_percent():
    """`mtp train --blocks 2 --drafter standalone`: the drafter grows with the head it is compared with."""
    head = parameter_counts(default_config(8192, SMOLLM2.max_position), HeadConfig.for_backbone(SMOLLM2, num_blocks=2))
    cfg = config_near(8192, SMOLLM2.max_position, head["head"])
    counts = parameter_counts(cfg, HeadConfig.for_backbone(SMOLLM2, num_blocks=2))
    assert cfg.hidden_size > 256 and 0.75 <= counts["ratio"] <= 1.25, (cfg, counts)


def test_training_forward_matches_the_backbone_run():
    drafter = small_drafter(seed=1)
    tokens = torch.randint(0, drafter.cfg.vocab_size, (2, 13), generator=torch.Generator().manual_seed(0))
    want = drafter.to(torch.float32).model(tokens, drafter.model.new_cache(2, 16))
    got = train_drafter.forward_hidden(drafter.cfg, drafter.weights, tokens)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _answers(n=6):
    seqs = []
    for i in range(n):
        prompt = torch.randint(4, 90, (5,), generator=torch.Generator().manual_seed(i)).tolist()
        answer = [10 + (i + j) % 5 for j in range(20)] + [95]  # 95: outside the vocabulary below
        seqs.append(train.Sequence(torch.tensor(prompt + answer), len(prompt), *[torch.empty(0)] * 3))
    return seqs


def test_training_is_seeded_and_learns():
    seqs = _answers()
    tc = train.TrainConfig(batch=3, lr=3e-2, max_steps=30, minutes=5, seed=2)
    runs = []
    for _ in range(2):
        drafter = small_drafter(vocab=torch.arange(4, 90), seed=2)
        runs.append((drafter, train_drafter.train_drafter(drafter, seqs, seqs[:2], tc, log=lambda m: None)))
    (d1, r1), (d2, _) = runs
    assert all(torch.equal(w, d2.weights[n]) for n, w in d1.weights.items())
    assert r1["steps"] == 30 and d1.trained and r1["last_loss"] < 0.5 * r1["first_loss"]
    assert r1["val_acc"] > 0.5


def test_run_drafter_trains_on_the_cached_distilled_rows(tmp_path):
    import json

    from mtp_kernels.models.checkpoint import load

    write_tiny_folder(tmp_path / "tiny")
    tok = load(str(tmp_path / "tiny"))[2]
    prompts = [f"prompt {c}" for c in "abcdefgh"]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"task": "t", "prompt": p}) + "\n" for p in prompts))
    # Cached answers (as distillation writes them): no backbone generation needed.
    (tmp_path / "distilled.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "task": "t",
                    "prompt_ids": tok.encode(tok.apply_chat_template(p)),
                    "answer_ids": [10 + (i + j) % 5 for j in range(12)],
                    "max_new_tokens": 12,
                    "distilled_by": train.DISTILLED_BY,
                }
            )
            + "\n"
            for i, p in enumerate(prompts)
        )
    )
    tc = train.TrainConfig(batch=4, max_steps=3, minutes=1)
    result = train_drafter.run_drafter(
        str(tmp_path / "prompts.jsonl"),
        str(tmp_path / "out"),
        str(tmp_path),
        tc,
        vocab_size=6,
        max_new_tokens=12,
        log=lambda m: None,
        model=str(tmp_path / "tiny"),
    )
    assert result["val_sequences"] == 1 and result["sequences"] == 7 and result["steps"] == 3
    saved = json.loads((tmp_path / "out" / "training.json").read_text())  # what it was trained on
    assert saved["prompts"] == [str(tmp_path / "prompts.jsonl")] and saved["distilled_by"] == train.DISTILLED_BY
    d = StandaloneDrafter.load(tmp_path / "out")
    assert d.trained and d.cfg.vocab_size == 7 and 3 in d.vocab.tolist()  # EOS always in the vocabulary
    (tmp_path / "bad.jsonl").write_text('{"task": "t"}\n')
    with pytest.raises(ValueError, match='expected JSON lines with a string "prompt"'):
        train_drafter.run_drafter(
            str(tmp_path / "bad.jsonl"), str(tmp_path / "out"), str(tmp_path), tc, model=str(tmp_path / "tiny")
        )


# ---- the `mtp` command ---------------------------------------------------------------------
def test_cli_generate_with_a_drafter_equals_no_mtp(tmp_path, capsys, monkeypatch):
    import json

    write_tiny_folder(tmp_path / "tiny")
    copy_of_backbone(torch.arange(TINY.vocab_size)).save(tmp_path / "d")
    base = ["generate", "--model", str(tmp_path / "tiny"), "--prompt", "hello", "--max-new-tokens", "8", "--json"]
    assert cli.main(base + ["--no-mtp"]) == 0
    want = json.loads(capsys.readouterr().out)["tokens"]
    assert cli.main(base + ["--drafter", "standalone", "--drafter-path", str(tmp_path / "d"), "--k", "3"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert got["tokens"] == want and sum(got["accepted_by_position"]) > 0 and "UNTRAINED" in err
    # A missing drafter: one line, exit 2 (explicit path, and no shipped default).
    assert cli.main(base + ["--drafter", "standalone", "--drafter-path", str(tmp_path / "nope")]) == 2
    assert "not a standalone drafter" in capsys.readouterr().err
    monkeypatch.setattr(loading, "SHIPPED_HEADS", str(tmp_path / "nothing"))
    assert cli.main(base + ["--drafter", "standalone"]) == 2
    err = capsys.readouterr().err
    assert "no standalone drafter" in err and "mtp train --drafter standalone" in err and len(err.splitlines()) == 1


def test_cli_train_drafter_bad_input(tmp_path, capsys):
    missing = str(tmp_path / "none.jsonl")
    assert cli.main(["train", "--drafter", "standalone", "--work-dir", str(tmp_path), "--prompts", missing]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and len(err.splitlines()) == 1
    (tmp_path / "bad.jsonl").write_text("not json\n")
    assert (
        cli.main(
            ["train", "--drafter", "standalone", "--work-dir", str(tmp_path), "--prompts", str(tmp_path / "bad.jsonl")]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "cannot read the prompts" in err and len(err.splitlines()) == 1
    assert cli.main(["train", "--drafter", "standalone", "--draft-vocab", "0"]) == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "--drafter", "bogus"])
    assert e.value.code == 2
