"""Head training: the differentiable unrolled head computes what MTPHead.draft runs, the
backbone stays frozen, training is seeded and reproducible, and the loss goes down."""

import dataclasses

import pytest
import torch

from mtp_kernels import data, train
from mtp_kernels.models.head import HeadConfig, MTPHead
from mtp_kernels.models.llama import Backbone
from tiny_model import TINY, tiny_backbone


def _head(seed=0, **kw):
    torch.manual_seed(seed)
    return MTPHead(HeadConfig.for_backbone(TINY, **kw))


def _greedy_sequence(model, head, prompt, k):
    """prompt + the backbone's next token + the head's K drafts after it."""
    cache = model.new_cache(1, 64)
    hidden = model(torch.tensor([prompt]), cache)[:, -1]
    token = model.logits(hidden).argmax(-1)
    drafts = head.draft(model, cache, hidden, token, k)
    return prompt + [int(token)] + drafts[0].tolist()


@pytest.mark.parametrize("kw", [{}, {"kv_layer": 0}, {"num_blocks": 2}, {"draft_vocab_size": 40}])
def test_unrolled_head_reproduces_draft(kw):
    """Feed the head its own drafts as the teacher tokens: the unrolled logits at the
    last prompt position must pick exactly those drafts, step after step."""
    model = tiny_backbone()
    head = _head(**kw)
    vocab = torch.arange(TINY.vocab_size)
    if kw.get("draft_vocab_size"):
        vocab = torch.randperm(TINY.vocab_size, generator=torch.Generator().manual_seed(1))[:40]
        head.set_draft_vocab(vocab)
    k = 5
    for seed, n in [(0, 7), (1, 12), (2, 1)]:
        prompt = torch.randint(4, TINY.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
        seq = _greedy_sequence(model, head, prompt, k)
        s = train.sequence_from_backbone(model, seq, len(prompt), head.cfg.kv_layer)
        # Exact fp32 features (bf16 storage would round them).
        s.hidden, s.k, s.v = (
            model(torch.tensor([seq]), c := model.new_cache(1, 64))[0],
            c.k[head.cfg.kv_layer % TINY.num_layers, 0, :, : len(seq)],
            c.v[head.cfg.kv_layer % TINY.num_layers, 0, :, : len(seq)],
        )
        anchors = train.answer_anchors([s])
        assert anchors[0, 0] == len(prompt) - 1
        logits = train.unrolled_logits(head, model, [s], anchors, k, model.lm_head[vocab])
        picked = [int(vocab[lg[0, 0].argmax()]) for lg in logits]
        assert picked == seq[len(prompt) + 1 :]


def test_anchors_and_targets():
    seqs = [
        train.Sequence(
            torch.tensor([5, 6, 7, 8, 9, 10]), 3, torch.zeros(6, 4), torch.zeros(1, 6, 2), torch.zeros(1, 6, 2)
        ),
        train.Sequence(torch.tensor([5, 6, 7, 11]), 1, torch.zeros(4, 4), torch.zeros(1, 4, 2), torch.zeros(1, 4, 2)),
    ]
    anchors = train.answer_anchors(seqs)
    # From the last prompt position to the last one with a token two further.
    assert anchors.tolist() == [[2, 3], [0, 1]]
    index = torch.full((20,), train.IGNORE)
    index[torch.tensor([8, 9, 10, 7])] = torch.tensor([0, 1, 2, 3])
    t0, t1 = train.unrolled_targets(seqs, anchors, 2, index)
    # Anchor 2 of sequence 0 predicts token 4 (id 9) at step 0 and id 10 at step 1; 11 is not in the vocabulary.
    assert t0.tolist() == [[1, 2], [3, -100]]
    assert t1.tolist() == [[2, -100], [-100, -100]]
    limited = train.answer_anchors(seqs, limit=1, rng=__import__("random").Random(0))
    assert limited.shape == (2, 1) and limited[0, 0] in (2, 3)


def test_prompt_anchors_target_the_backbones_greedy_tokens():
    """Inside the prompt the next token is the user's: the target of step j at anchor p is
    the backbone's argmax after token p+1+j (Sequence.greedy) until that input reaches the
    prompt's last token; from there on it is the answer's own token, as for answer anchors."""
    tokens = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])  # prompt 1..5, answer 6, 7, 8
    greedy = torch.tensor([11, 12, 13, 14, 6, 7, 8, 9])  # argmax after each position (6 follows the prompt)
    s = train.Sequence(tokens, 5, torch.zeros(8, 4), torch.zeros(1, 8, 2), torch.zeros(1, 8, 2), greedy)
    anchors = train.answer_anchors([s], limit=0, rng=__import__("random").Random(0), prompt_limit=10)
    assert anchors.tolist() == [[0, 1, 2, 3, 4, 5]]  # every prompt position before the last one, then the answer's
    index = torch.arange(20)
    t0, t1, t2 = train.unrolled_targets([s], anchors, 3, index)
    assert t0.tolist() == [[12, 13, 14, 6, 7, 8]]
    assert t1.tolist() == [[13, 14, 6, 7, 8, -100]]
    assert t2.tolist() == [[14, 6, 7, 8, -100, -100]]
    # Without prompt anchors the targets are what they always were; without greedy tokens a
    # prompt anchor is an error, not a silent wrong target.
    plain = train.answer_anchors([s])
    assert [t.tolist() for t in train.unrolled_targets([s], plain, 3, index)] == [[[7, 8]], [[8, -100]], [[-100, -100]]]
    s.greedy = None
    with pytest.raises(ValueError, match="need the backbone's greedy tokens"):
        train.unrolled_targets([s], anchors, 1, index)
    # At most prompt_limit prompt anchors, drawn at random (seeded).
    few = train.answer_anchors([s], rng=__import__("random").Random(0), prompt_limit=2)
    assert few.shape == (1, 4) and few[0, 2:].tolist() == [4, 5] and set(few[0, :2].tolist()) <= {0, 1, 2, 3}


def test_sequence_greedy_is_the_backbones_argmax():
    model = tiny_backbone()
    seq = [5, 9, 3, 7, 11, 2]
    s = train.sequence_from_backbone(model, seq, 3, -1)
    for t in (s.k, s.v, s.hidden):  # its own bytes, not a view keeping every layer's cache alive
        assert t.untyped_storage().nbytes() == t.nbytes
    cache = model.new_cache(1, 16)
    assert torch.equal(s.greedy, model.logits(model(torch.tensor([seq]), cache)[0]).argmax(-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_distill_is_greedy_decoding_and_its_features_are_the_teacher_forced_ones(dtype):
    """Batched distillation gives each prompt exactly what greedy decoding gives it alone,
    and the features it keeps on the way are bitwise those of one teacher-forced pass
    over prompt + answer (hidden states, the layer's K/V, the argmax after each token)."""
    from mtp_kernels import decoding

    model = tiny_backbone(dtype)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(4, TINY.vocab_size, (n,), generator=g).tolist() for n in (5, 9, 1, 7, 12)]
    plain = [decoding.generate(model, [p], 10)[0].tokens for p in prompts]
    eos = (plain[1][3],)  # stops some requests early while the others go on in the same batch
    want = [decoding.generate(model, [p], 10, eos_token_ids=eos)[0].tokens for p in prompts]
    assert any(len(w) < 10 for w in want) and any(len(w) == 10 for w in want)
    seqs = train.distill(model, prompts, 10, eos, kv_layer=1, batch=2, log=lambda m: None)
    for p, w, s in zip(prompts, want, seqs):
        assert s.prompt_len == len(p) and s.tokens.tolist() == p + w
        r = train.sequence_from_backbone(model, s.tokens.tolist(), len(p), 1)
        for name in ("hidden", "k", "v", "greedy"):
            assert torch.equal(getattr(s, name), getattr(r, name)), name
        assert s.greedy[len(p) - 1 : -1].tolist() == w  # each answer token is the argmax after the one before


def test_distilled_rows_cache_our_answers_and_ignore_other_backbones(tmp_path, monkeypatch):
    import json

    from tiny_model import write_tiny_folder
    from mtp_kernels.models.checkpoint import load

    write_tiny_folder(tmp_path / "tiny")
    cfg, weights, tok = load(str(tmp_path / "tiny"))
    prompts = [f"prompt {c}" for c in "abc"]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"task": "t", "prompt": p}) + "\n" for p in prompts))
    ids = [tok.encode(tok.apply_chat_template(p)) for p in prompts]
    # An answer cached by another backbone (no distilled_by) is not ours: it is distilled again.
    (tmp_path / "distilled.jsonl").write_text(
        json.dumps({"task": "t", "prompt_ids": ids[0], "answer_ids": [9, 9], "max_new_tokens": 6}) + "\n"
    )
    model = Backbone(cfg, weights, torch.bfloat16)  # the teacher as distilled_rows' caller loads it
    args = (str(tmp_path / "prompts.jsonl"), str(tmp_path), 6, 0, model, tok, lambda m: None)
    rows, seqs = train.distilled_rows(*args, kv_layer=1)
    assert [r["prompt_ids"] for r in rows] == ids and rows[0]["answer_ids"] != [9, 9]
    cached = [json.loads(line) for line in (tmp_path / "distilled.jsonl").read_text().splitlines()]
    assert len(cached) == 4 and all(c["distilled_by"] == train.DISTILLED_BY for c in cached[1:])
    # The second run reuses every answer (no generation) and rebuilds the same features.
    monkeypatch.setattr(train, "distill", lambda *a, **k: pytest.fail("cached answers distilled again"))
    rows2, seqs2 = train.distilled_rows(*args, kv_layer=1)
    assert rows2 == rows
    for s, s2 in zip(seqs, seqs2):
        assert all(torch.equal(getattr(s, n), getattr(s2, n)) for n in ("tokens", "hidden", "k", "v", "greedy"))
    assert train.distilled_rows(*args)[1] is None  # the drafter's call: rows only


def test_soft_targets_are_the_backbones_distribution_over_the_draft_vocabulary():
    """Step j at anchor p: the softmax of the backbone's logits after position p+1+j over the
    draft vocabulary's rows; on its own greedy answers their argmax is the hard target."""
    model = tiny_backbone()
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(4, TINY.vocab_size, (n,), generator=g).tolist() for n in (4, 9)]
    seqs = train.distill(model, prompts, 8, (), kv_layer=-1, batch=2, log=lambda m: None)
    vocab = torch.arange(TINY.vocab_size).flip(0)  # any order: the index maps ids to rows
    index = torch.empty(TINY.vocab_size, dtype=torch.long)
    index[vocab] = torch.arange(TINY.vocab_size)
    anchors = train.answer_anchors(seqs)
    soft = train.soft_targets(seqs, anchors, 3, model.lm_head[vocab].float())
    hard = train.unrolled_targets(seqs, anchors, 3, index)
    checked = 0
    for j in range(3):
        assert soft[j].shape == (2, anchors.shape[1], TINY.vocab_size)
        for b, s in enumerate(seqs):
            for a, p in enumerate(anchors[b].tolist()):
                if hard[j][b, a] == train.IGNORE:
                    continue
                want = torch.softmax(s.hidden[p + 1 + j].float() @ model.lm_head[vocab].float().T, -1)
                assert torch.allclose(soft[j][b, a], want, rtol=1e-5, atol=1e-7)
                assert soft[j][b, a].argmax() == hard[j][b, a]
                checked += 1
    assert checked > 20


def test_draft_loss_mixes_hard_and_soft_cross_entropy_at_the_same_anchors():
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    logits = [torch.randn(2, 3, 5, generator=g) for _ in range(2)]
    targets = [torch.tensor([[1, 4, train.IGNORE], [0, 2, 3]]), torch.tensor([[2, train.IGNORE, 0], [1, 1, 4]])]
    soft = [torch.softmax(torch.randn(2, 3, 5, generator=g), -1) for _ in range(2)]
    hard = (
        sum(F.cross_entropy(lg.flatten(0, 1), t.flatten(), ignore_index=train.IGNORE) for lg, t in zip(logits, targets))
        / 2
    )

    def soft_ce(lg, t, q):
        keep = t.flatten() != train.IGNORE
        return -(q.flatten(0, 1)[keep] * F.log_softmax(lg.flatten(0, 1)[keep], -1)).sum(-1).mean()

    pure_soft = sum(soft_ce(lg, t, q) for lg, t, q in zip(logits, targets, soft)) / 2
    assert torch.equal(train.draft_loss(logits, targets, None, 0.0), hard)
    assert torch.allclose(train.draft_loss(logits, targets, soft, 1.0), pure_soft)
    assert torch.allclose(train.draft_loss(logits, targets, soft, 0.25), 0.75 * hard + 0.25 * pure_soft)
    # An ignored anchor's soft target counts in neither loss.
    changed = [q.clone() for q in soft]
    changed[0][0, 2] = torch.tensor([1.0, 0, 0, 0, 0])
    assert torch.equal(train.draft_loss(logits, targets, changed, 0.5), train.draft_loss(logits, targets, soft, 0.5))
    # A step whose targets are all ignored (anchors near the end of short answers) adds 0, not NaN.
    none = [targets[0], torch.full_like(targets[1], train.IGNORE)]
    want = F.cross_entropy(logits[0].flatten(0, 1), targets[0].flatten(), ignore_index=train.IGNORE) / 2
    assert torch.allclose(train.draft_loss(logits, none, None, 0.0), want)
    assert torch.isfinite(train.draft_loss(logits, none, soft, 0.5))
    leaf = [lg.clone().requires_grad_() for lg in logits]
    nothing = train.draft_loss(leaf, [torch.full_like(t, train.IGNORE) for t in targets], soft, 0.5)
    nothing.backward()
    assert nothing.item() == 0 and torch.equal(leaf[0].grad, torch.zeros_like(leaf[0]))


def test_draft_vocabulary_is_by_frequency_and_keeps_eos():
    v = train.draft_vocabulary([[5, 5, 5, 7, 7, 9], [7, 5]], 3, 12, always=(3,))
    assert v.tolist() == [3, 5, 7]


def _tiny_data(model, n=6, length=24):
    seqs = []
    for i in range(n):
        # Learnable answers: a repeating pattern after a random prompt.
        g = torch.Generator().manual_seed(i)
        prompt = torch.randint(4, TINY.vocab_size, (6,), generator=g).tolist()
        answer = [10 + (i + j) % 5 for j in range(length)]
        seqs.append(train.sequence_from_backbone(model, prompt + answer, len(prompt), -1))
    return seqs


@pytest.mark.parametrize("soft", [0.0, 0.5])
def test_training_keeps_backbone_frozen_is_seeded_and_learns(soft):
    model = tiny_backbone()
    before = {n: b.clone() for n, b in model.named_buffers()}
    seqs = _tiny_data(model)
    runs = []
    for _ in range(2):
        head = _head(seed=3)
        train.init_from_backbone(head, model)
        tc = train.TrainConfig(steps=3, batch=3, lr=3e-3, max_steps=40, minutes=10, seed=7, soft_targets=soft)
        log = train.train_head(head, model, seqs, seqs[:2], tc, log=lambda m: None)
        runs.append((head, log))
    for n, b in model.named_buffers():
        assert torch.equal(b, before[n]), f"backbone buffer {n} changed"
    (h1, log1), (h2, log2) = runs
    for (n, p1), p2 in zip(h1.named_parameters(), h2.parameters()):
        assert torch.equal(p1, p2), f"two runs with the same seed differ in {n}"
    assert log1["steps"] == 40
    # The soft targets' cross-entropy cannot fall below their entropy (the tiny backbone's
    # distributions are broad), so only the hard loss is held to halving.
    assert log1["last_loss"] < (0.5 if soft == 0 else 0.8) * log1["first_loss"]
    assert log1["curve"][-1]["acc_by_step"][0] > 0.5


def test_add_typos_changes_words_and_is_seeded():
    import random

    text = "Setting up volumes requires the package which provides commands for managing arrays " * 3
    a, b = data.add_typos(text, random.Random(1)), data.add_typos(text, random.Random(1))
    assert a == b and a != text and len(a.split(" ")) == len(text.split(" "))


def test_make_prompt_rejects_unknown_task():
    import random

    with pytest.raises(ValueError, match="unknown task"):
        data.make_prompt("poetry", random.Random(0), ["a"], ["b"])


def test_interrupted_training_resumes_to_the_same_bits(tmp_path, monkeypatch):
    """A run killed after a checkpoint, then run again, ends with the weights of an
    uninterrupted run; so does one stopped by its time cap and run again with more time."""
    monkeypatch.setattr(train, "VALIDATE_EVERY", 10)
    model = tiny_backbone()
    seqs = _tiny_data(model)
    tc = train.TrainConfig(steps=2, batch=3, lr=3e-3, max_steps=30, minutes=10, seed=5)

    def run(ckpt=None, log=lambda m: None, tc=tc):
        head = _head(seed=3)
        train.init_from_backbone(head, model)
        return head, train.train_head(head, model, seqs, seqs[:2], tc, log=log, checkpoint=ckpt)

    want, want_log = run()
    ckpt = str(tmp_path / "head.ckpt")

    def killed_at_25(m):
        if m.startswith("train: step 25"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(ckpt, killed_at_25)
    logs = []
    got, got_log = run(ckpt, logs.append)
    assert "train: resuming" in logs[0] and "at step 20" in logs[0]
    for (n, p), q in zip(want.named_parameters(), got.parameters()):
        assert torch.equal(p, q), f"the resumed run differs in {n}"
    assert [c["step"] for c in got_log["curve"]] == [c["step"] for c in want_log["curve"]]
    assert not (tmp_path / "head.ckpt").exists()  # done: removed
    # The time cap saves where it stops; the next run (any cap) continues to the same bits.
    run(ckpt, tc=dataclasses.replace(tc, minutes=0))
    assert (tmp_path / "head.ckpt").exists()
    got, _ = run(ckpt)
    assert all(torch.equal(p, q) for p, q in zip(want.parameters(), got.parameters()))
    # Another configuration does not resume a checkpoint that is not its own.
    run(ckpt, tc=dataclasses.replace(tc, minutes=0))
    logs = []
    run(ckpt, logs.append, tc=dataclasses.replace(tc, lr=1e-3))
    assert any("another configuration" in m for m in logs)


def test_distilled_answers_are_the_default_backbones_greedy(tmp_path):
    """The teacher is the backbone `mtp generate` runs by default: a GGUF's own block-quantized
    weights as stored, bf16 activations. Its cached answers are that backbone's greedy tokens."""
    import json

    from mtp_kernels import decoding
    from mtp_kernels.models import loading
    from test_native import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    cfg, model, tok, what = loading.load_backbone(path, None, print)
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("ab c", "d e f g", "h")))
    rows, seqs = train.distilled_rows(str(tmp_path / "p.jsonl"), str(tmp_path), 6, 0, model, tok, print, 0)
    assert "as stored" in what and model.native
    eos = tuple(cfg.eos_token_ids)
    for r, s in zip(rows, seqs):
        assert r["answer_ids"] == decoding.generate(model, [r["prompt_ids"]], 6, eos_token_ids=eos)[0].tokens
        want = train.sequence_from_backbone(model, r["prompt_ids"] + r["answer_ids"], len(r["prompt_ids"]), 0)
        assert all(torch.equal(getattr(s, n), getattr(want, n)) for n in ("hidden", "k", "v", "greedy"))
