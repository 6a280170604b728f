"""examples/continuous_batching.py on the tiny model: requests join and leave a few cache slots,
each pass carries a different number of drafts per request, one verify_ragged call per step,
and every request's output equals decoding it alone."""

import importlib.util
import pathlib
import sys

import pytest
import torch

from tiny_model import TINY, tiny_backbone

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("continuous_batching", ROOT / "examples" / "continuous_batching.py")
cb = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = cb  # dataclasses look their module up
spec.loader.exec_module(cb)


def make_requests(n, seed, max_new=30):
    gen = torch.Generator().manual_seed(seed)
    return [
        cb.Request(
            rid=i,
            prompt=torch.randint(
                4, TINY.vocab_size, (int(torch.randint(2, 16, (1,), generator=gen)),), generator=gen
            ).tolist(),
            max_new_tokens=int(torch.randint(1, max_new, (1,), generator=gen)),
            arrival=int(torch.randint(0, 20, (1,), generator=gen)),
        )
        for i in range(n)
    ]


def oracle_drafter(want, seed):
    """Drafts from each request's true continuation, every 4th one wrong on average: both the
    accepted and the rejected paths (and the bonus token) are exercised."""
    gen = torch.Generator().manual_seed(seed)

    def draft(r, budget):
        truth = want[r.rid][len(r.tokens) :]
        out = []
        for tok in truth[:budget]:
            out.append(tok if torch.rand(1, generator=gen).item() < 0.75 else (tok + 1) % TINY.vocab_size)
        return out

    return draft


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slots", [1, 3])
def test_each_request_equals_decoding_it_alone(dtype, slots):
    model = tiny_backbone(dtype)
    eos = TINY.eos_token_ids
    requests = make_requests(9, seed=slots)
    want = {r.rid: cb.alone(model, r, eos) for r in requests}
    steps = []
    cb.serve(
        model,
        requests,
        slots=slots,
        max_drafts=5,
        drafter=oracle_drafter(want, seed=7),
        eos_token_ids=eos,
        on_step=lambda s, run, counts: steps.append(([r.rid for r in run], counts)),
    )
    for r in requests:
        assert r.tokens == want[r.rid], r.rid
        assert r.done
    accepted = sum(r.accepted for r in requests)
    assert 0 < accepted < sum(r.drafted for r in requests)  # some drafts accepted, some rejected
    if slots > 1:
        # Several requests per step with different draft counts (K_b = 0 among them), and the
        # set of running requests changes: requests joined and left between steps.
        assert any(len(set(c)) > 1 and 0 in c for _, c in steps)
        assert len({tuple(ids) for ids, _ in steps}) > 3


def test_lookup_drafter_and_the_example_main(capsys):
    cb.main()
    assert "every request's output equals decoding it alone" in capsys.readouterr().out
