"""Tree drafts: mtp.decoder_layers with tree_parents (each token attends to the cache and its
own path from the root) gives every token the bits a chain of its path gives, and the op-by-op
composition's (reference.decoder_layers with the kernels); mtp.head_draft's alternatives are
the first step's next best drafts in torch.argmax's order. Across dtypes, Q8 / int8-dot
weights, every instruction set, ragged lengths, a path crossing an attention chunk boundary;
opcheck; bad input."""

import re

import pytest
import torch

from mtp_kernels import reference
from test_decoder import KERNEL_OPS, VARIANTS, Draft, Pass, to_cuda
from test_rowwise import assert_bitwise

# (cache lengths before the pass, parents per request): a chain, the generate loop's shape (a
# chain of 3 and two other first drafts), a deeper tree, and one whose paths cross the
# attention chunk boundary at 256 keys.
TREES = [
    ([3, 7], [[-1, 0, 1, 2], [-1, 0, 1, 2]]),
    ([5, 0], [[-1, 0, 1, 2, 0, 0], [-1, 0, 0, 2, 1, 4]]),
    ([252, 9], [[-1, 0, 1, 2, 3, 0, 5], [-1, 0, 1, 0, 3, 3, 1]]),
]


def tree_pass(dtype, quantize, int8_dot, lens, parents):
    p = Pass(dtype, quantize, int8_dot, lens, len(parents[0]), capacity=max(lens) + 16)
    return p, torch.tensor(parents)


@pytest.mark.parametrize("dtype,quantize,int8_dot", VARIANTS)
@pytest.mark.parametrize("lens,parents", TREES)
def test_each_token_has_the_bits_of_a_chain_of_its_path(isa, dtype, quantize, int8_dot, lens, parents):
    p, tree = tree_pass(dtype, quantize, int8_dot, lens, parents)
    args = p.args()
    got = torch.ops.mtp.decoder_layers(*args, quantize_x=p.quantize_x, tree_parents=tree)
    k, v = args[1], args[2]
    for b, rows in enumerate(reference.tree_paths(tree)):
        for t, path in enumerate(rows):
            chain = list(p.args(x=p.x[b : b + 1, path]))
            chain[1], chain[2] = chain[1][:, b : b + 1], chain[2][:, b : b + 1]
            chain[3] = chain[3][b : b + 1]
            want = torch.ops.mtp.decoder_layers(*chain, quantize_x=p.quantize_x)
            assert_bitwise(got[b, t], want[0, -1])
            n = lens[b]  # stored at n + t, as the chain stores it at n + depth
            assert torch.equal(k[:, b, :, n + t], chain[1][:, 0, :, n + len(path) - 1])
            assert torch.equal(v[:, b, :, n + t], chain[2][:, 0, :, n + len(path) - 1])


@pytest.mark.parametrize("dtype,quantize,int8_dot", VARIANTS[::3])
@pytest.mark.parametrize("lens,parents", TREES[1:])
def test_tree_pass_equals_the_op_by_op_composition(dtype, quantize, int8_dot, lens, parents):
    p, tree = tree_pass(dtype, quantize, int8_dot, lens, parents)
    got = torch.ops.mtp.decoder_layers(*p.args(), quantize_x=p.quantize_x, tree_parents=tree)
    assert_bitwise(got, reference.decoder_layers(*p.args(), quantize_x=p.quantize_x, tree_parents=tree, ops=KERNEL_OPS))
    want = reference.decoder_layers(*p.args(), quantize_x=p.quantize_x, tree_parents=tree)  # fp64 reference ops
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=0.1, atol=0.1)
    torch.testing.assert_close(got.float(), want.float(), **tol)


def test_a_chain_tree_is_the_plain_pass():
    p, tree = tree_pass(torch.bfloat16, False, False, [3, 7], [[-1, 0, 1, 2]] * 2)
    assert torch.equal(
        torch.ops.mtp.decoder_layers(*p.args(), tree_parents=tree.int()), torch.ops.mtp.decoder_layers(*p.args())
    )


def test_tree_threads_and_opcheck(threads):
    p, tree = tree_pass(torch.float32, True, True, *TREES[2])
    results = []
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        results.append(torch.ops.mtp.decoder_layers(*p.args(), quantize_x=True, tree_parents=tree))
    assert all(torch.equal(r, results[0]) for r in results)
    torch.library.opcheck(torch.ops.mtp.decoder_layers.default, p.args(), {"quantize_x": True, "tree_parents": tree})


def test_bad_tree_parents_raise_clear_errors():
    p, tree = tree_pass(torch.float32, False, False, [3, 7], [[-1, 0, 1, 0]] * 2)
    from mtp_kernels import fallback

    def bad(message, parents):
        for fn in (torch.ops.mtp.decoder_layers, fallback.decoder_layers):  # the CUDA fallback's checks too
            with pytest.raises(RuntimeError, match=re.escape("mtp.decoder_layers: " + message)):
                fn(*p.args(), tree_parents=parents)

    bad("tree_parents must be int32 or int64, got Float", tree.float())
    bad("tree_parents must be [B, T] = [2, 4] (x's first two sizes), got [2, 3]", tree[:, :3])
    bad("tree_parents must be [B, T] = [2, 4] (x's first two sizes), got [4]", tree[0])
    bad("tree_parents[1][0] must be -1 (row 0 is the root), got 0", torch.tensor([[-1, 0, 1, 0], [0, 0, 1, 0]]))
    bad("tree_parents[0][2] must be an earlier row in [0, 2), got 2", torch.tensor([[-1, 0, 2, 0], [-1, 0, 1, 0]]))
    bad("tree_parents[0][3] must be an earlier row in [0, 3), got -1", torch.tensor([[-1, 0, 1, -1], [-1, 0, 1, 0]]))


# ---- mtp.head_draft's alternatives ------------------------------------------------------------


def test_argmax_order_is_torch_argmax_rule_repeated():
    nan, inf = float("nan"), float("inf")
    logits = torch.tensor(
        [
            [1.0, 3.0, 3.0, -inf, 2.0, -0.0, 0.0],
            [1.0, nan, 5.0, nan, -inf, inf, 5.0],
            [-inf, -inf, -inf, -inf, -inf, -inf, -inf],
        ]
    )
    order = reference.argmax_order(logits)
    assert order.tolist() == [[1, 2, 4, 0, 5, 6, 3], [1, 3, 5, 2, 6, 0, 4], [0, 1, 2, 3, 4, 5, 6]]
    assert torch.equal(order[:, 0], logits.argmax(-1))
    bf16 = torch.randn(4, 50).bfloat16().round()  # many ties
    order = reference.argmax_order(bf16)
    assert torch.equal(order[:, 0], bf16.argmax(-1))
    for row, o in zip(bf16.float(), order):
        v = row[o]
        assert bool((v[:-1] >= v[1:]).all())  # descending, and ties by index:
        assert all(o[i] < o[i + 1] for i in range(len(o) - 1) if v[i] == v[i + 1])


@pytest.mark.parametrize(
    "dtype,quantize,lens,blocks,vocab", [(torch.float32, False, [5], 1, 0), (torch.bfloat16, True, [3, 9], 2, 40)]
)
@pytest.mark.parametrize("k,alternatives", [(1, 2), (3, 2), (2, 39)])
def test_head_draft_alternatives(isa, dtype, quantize, lens, blocks, vocab, k, alternatives):
    d = Draft(dtype, quantize, lens, blocks, vocab)
    if alternatives >= (vocab or 97):
        return
    got = torch.ops.mtp.head_draft(**d.args(k), alternatives=alternatives)
    assert got.shape == (len(lens), k + alternatives)
    assert torch.equal(got[:, :k], torch.ops.mtp.head_draft(**d.args(k)))  # the chain unchanged
    assert torch.equal(got, reference.head_draft(**d.args(k), alternatives=alternatives, ops=KERNEL_OPS))
    first = got[:, [0] + list(range(k, k + alternatives))]
    assert all(len(set(row)) == len(row) for row in first.tolist())  # distinct first drafts
    if vocab:
        assert bool(torch.isin(got, d.head.draft_vocab).all())


def test_head_draft_alternatives_opcheck_and_bad_input():
    from mtp_kernels import fallback

    d = Draft(torch.float32, True, [3, 9], 1, 40)
    torch.library.opcheck(torch.ops.mtp.head_draft.default, tuple(d.args(2).values()), {"alternatives": 2})
    for fn in (torch.ops.mtp.head_draft, fallback.head_draft):
        for k, alt, message in [
            (2, 40, "alternatives must be in [0, 40) (fewer than the draft vocabulary's 40 tokens), got 40"),
            (2, -1, "alternatives must be in [0, 40)"),
            (0, 1, "alternatives are first drafts: they need k >= 1, got k = 0"),
        ]:
            with pytest.raises(RuntimeError, match=re.escape("mtp.head_draft: " + message)):
                fn(**d.args(k), alternatives=alt)


def test_cuda_fallbacks_take_trees_and_alternatives_on_cpu_tensors():
    """On CUDA both ops run fallback.py's composition of the kernels; here on CPU tensors it
    gives the fused ops' bits for a tree and for alternative first drafts."""
    from mtp_kernels import fallback

    p, tree = tree_pass(torch.bfloat16, False, False, *TREES[1])
    assert torch.equal(
        fallback.decoder_layers(*p.args(), tree_parents=tree),
        torch.ops.mtp.decoder_layers(*p.args(), tree_parents=tree),
    )
    d = Draft(torch.float32, True, [3, 9], 1, 40)
    assert torch.equal(
        fallback.head_draft(**d.args(3), alternatives=2), torch.ops.mtp.head_draft(**d.args(3), alternatives=2)
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only: needs CUDA")
def test_cuda_tree_pass_equals_chains_of_its_paths():
    """On a GPU: each token of a tree pass equals, bitwise, the last of a chain pass of its path."""
    p, tree = tree_pass(torch.float32, False, False, *TREES[1])
    got = torch.ops.mtp.decoder_layers(*to_cuda(p.args()), tree_parents=tree.cuda())
    for b, rows in enumerate(reference.tree_paths(tree)):
        for t, path in enumerate(rows):
            chain = to_cuda(p.args(x=p.x[b : b + 1, path]))
            chain[1], chain[2], chain[3] = chain[1][:, b : b + 1], chain[2][:, b : b + 1], chain[3][b : b + 1]
            assert torch.equal(got[b, t], torch.ops.mtp.decoder_layers(*chain)[0, -1])
