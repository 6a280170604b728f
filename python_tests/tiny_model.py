"""A tiny random-weight Llama (and helpers) for fast runtime tests."""
import torch

from mtp_kernels.models.checkpoint import expected_shapes
from mtp_kernels.models.config import LlamaConfig
from mtp_kernels.models.llama import Backbone

TINY = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0, max_position=256, tie_embeddings=True,
                   eos_token_ids=(3,))


def tiny_weights(cfg: LlamaConfig = TINY, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {name: (torch.randn(shape, generator=g) * (0.5 if len(shape) == 1 else 1.0 / shape[-1] ** 0.5)
                   + (1.0 if len(shape) == 1 else 0.0))
            for name, shape in expected_shapes(cfg).items()}


def tiny_backbone(dtype=torch.float32, cfg: LlamaConfig = TINY) -> Backbone:
    return Backbone(cfg, tiny_weights(cfg), dtype)


class OracleHead:
    """A stand-in draft head that knows the greedy continuation and corrupts some drafts,
    so that every acceptance length (0..K) occurs."""

    def __init__(self, greedy_by_prompt_len: dict, vocab: int, seed: int = 0):
        self.future = greedy_by_prompt_len  # prompt length -> full greedy sequence (prompt + output)
        self.vocab = vocab
        self.g = torch.Generator().manual_seed(seed)

    def draft(self, model, cache, hidden, token, k):
        out = torch.empty(len(token), k, dtype=torch.int64)
        for b in range(len(token)):
            seq = self.future[b]
            pos = int(cache.lens[b]) + 1  # the pending token sits at cache.lens[b]
            for j in range(k):
                true = seq[pos + j] if pos + j < len(seq) else 0
                wrong = torch.rand(1, generator=self.g).item() < 0.25
                out[b, j] = (true + 1 + int(torch.randint(0, self.vocab - 1, (1,), generator=self.g))) % self.vocab \
                    if wrong else true
        return out
