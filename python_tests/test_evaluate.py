"""`mtp bench` (mtp_kernels/evaluate.py): per-task figures, the identity check against greedy,
its outputs, and bad input."""
import json

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
    md = evaluate.markdown({"command": "c", "setup": "s", "methods": {"ours_greedy": evaluate.summarize(greedy),
                                                                       "ours_mtp": s}})
    assert "| a | ours_mtp |" in md and "2/2" in md


def test_restrict_vocab_takes_a_prefix_and_restores():
    head = MTPHead(HeadConfig.for_backbone(TINY))
    head.set_draft_vocab(torch.tensor([9, 4, 7, 3]))
    evaluate.restrict_vocab(head, 2)
    assert head.draft_vocab.tolist() == [9, 4]
    evaluate.restrict_vocab(head, 0)
    assert head.draft_vocab.tolist() == [9, 4, 7, 3]


def test_cli_bench_on_a_tiny_model(tmp_path, capsys):
    write_tiny_folder(tmp_path / "tiny")
    torch.manual_seed(0)
    MTPHead(HeadConfig.for_backbone(TINY, trained=True)).save(tmp_path / "head")
    copy_of_backbone(torch.arange(TINY.vocab_size)).save(tmp_path / "drafter")  # drafts = greedy
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"task": t, "prompt": p}) + "\n" for t, p in
                                                 [("x", "abc"), ("x", "hello"), ("y", "zzz")]))
    out = tmp_path / "e2e"
    args = ["bench", "--model", str(tmp_path / "tiny"), "--head", str(tmp_path / "head"), "--eval-set",
            str(tmp_path / "eval.jsonl"), "--max-new-tokens", "6", "--methods", "ours_greedy,ours_mtp,ours_drafter",
            "--drafter-path", str(tmp_path / "drafter"), "--lenient", "top_k=2", "--out", str(out),
            "--dtype", "float32", "--sweep-per-task", "1", "--plot"]
    assert cli.main(args) == 0
    res = json.loads((tmp_path / "e2e.json").read_text())
    assert set(res["methods"]) == {"ours_greedy", "ours_mtp", "ours_drafter", "ours_mtp_lenient(top_k=2,min_ratio=0.0)"}
    assert res["methods"]["ours_mtp"]["x"]["identical_to_greedy"] == 2
    drafter = res["methods"]["ours_drafter"]["x"]
    assert drafter["identical_to_greedy"] == 2 and drafter["tau"] > 1  # a perfect drafter is accepted
    assert len(res["sweep"]) == 5 + 3 and (tmp_path / "e2e.png").stat().st_size > 1000
    assert "| y | ours_mtp |" in (tmp_path / "e2e.md").read_text()


def test_cli_bench_bad_input(tmp_path, capsys):
    for extra, msg in [(["--methods", "ours_mtp"], "including ours_greedy"),
                       (["--methods", "ours_greedy,nope"], "expected a comma-separated subset"),
                       (["--eval-set", str(tmp_path / "missing.jsonl")], "cannot read --eval-set"),
                       (["--lenient", "top_k=x"], "--lenient expects"),
                       (["--per-task", "0"], "--per-task must be >= 1")]:
        assert cli.main(["bench"] + extra) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err
