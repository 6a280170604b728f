"""Head training: the differentiable unrolled head computes what MTPHead.draft runs, the
backbone stays frozen, training is seeded and reproducible, and the loss goes down."""
import pytest
import torch

from mtp_kernels import data, train
from mtp_kernels.models.head import HeadConfig, MTPHead
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
        s.hidden, s.k, s.v = (model(torch.tensor([seq]), c := model.new_cache(1, 64))[0],
                              c.k[head.cfg.kv_layer % TINY.num_layers, 0, :, :len(seq)],
                              c.v[head.cfg.kv_layer % TINY.num_layers, 0, :, :len(seq)])
        anchors = train.answer_anchors([s])
        assert anchors[0, 0] == len(prompt) - 1
        logits = train.unrolled_logits(head, model, [s], anchors, k, model.lm_head[vocab])
        picked = [int(vocab[lg[0, 0].argmax()]) for lg in logits]
        assert picked == seq[len(prompt) + 1:]


def test_anchors_and_targets():
    seqs = [train.Sequence(torch.tensor([5, 6, 7, 8, 9, 10]), 3, torch.zeros(6, 4), torch.zeros(1, 6, 2),
                           torch.zeros(1, 6, 2)),
            train.Sequence(torch.tensor([5, 6, 7, 11]), 1, torch.zeros(4, 4), torch.zeros(1, 4, 2), torch.zeros(1, 4, 2))]
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
    cache = model.new_cache(1, 16)
    assert torch.equal(s.greedy, model.logits(model(torch.tensor([seq]), cache)[0]).argmax(-1))


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


def test_training_keeps_backbone_frozen_is_seeded_and_learns():
    model = tiny_backbone()
    before = {n: b.clone() for n, b in model.named_buffers()}
    seqs = _tiny_data(model)
    runs = []
    for _ in range(2):
        head = _head(seed=3)
        train.init_from_backbone(head, model)
        tc = train.TrainConfig(steps=3, batch=3, lr=3e-3, max_steps=40, minutes=10, seed=7)
        log = train.train_head(head, model, seqs, seqs[:2], tc, log=lambda m: None)
        runs.append((head, log))
    for n, b in model.named_buffers():
        assert torch.equal(b, before[n]), f"backbone buffer {n} changed"
    (h1, log1), (h2, log2) = runs
    for (n, p1), p2 in zip(h1.named_parameters(), h2.parameters()):
        assert torch.equal(p1, p2), f"two runs with the same seed differ in {n}"
    assert log1["steps"] == 40
    assert log1["last_loss"] < 0.5 * log1["first_loss"]
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
