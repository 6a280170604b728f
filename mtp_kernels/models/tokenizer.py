"""Tokenizer and chat template, built from a GGUF file's metadata or a tokenizer.json."""
from __future__ import annotations

import jinja2
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

GGUF_CONTROL = 3  # llama.cpp token type of special (control) tokens


class Tokenizer:
    def __init__(self, hf: HFTokenizer, chat_template: str | None, eos_token_ids: tuple[int, ...],
                 bos_token: str = "", eos_token: str = ""):
        self.hf = hf
        self.chat_template = chat_template
        self.eos_token_ids = eos_token_ids
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def from_gguf_fields(cls, tokens: list[str], token_types: list[int], merges: list[str], pre: str,
                         chat_template: str | None, eos_token_ids: tuple[int, ...]) -> "Tokenizer":
        """A byte-level BPE (llama.cpp's "gpt2" tokenizer model)."""
        vocab = {tok: i for i, tok in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        # SmolLM's pre-tokenizer splits digits one by one before the GPT-2 regex.
        hf.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                            if pre == "smollm" else byte_level)
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                               for i, t in enumerate(token_types) if t == GGUF_CONTROL])
        eos = tokens[eos_token_ids[0]] if eos_token_ids else ""
        return cls(hf, chat_template, eos_token_ids, eos_token=eos)

    @classmethod
    def from_files(cls, tokenizer_json: str, chat_template: str | None, eos_token_ids: tuple[int, ...]) -> "Tokenizer":
        hf = HFTokenizer.from_file(tokenizer_json)
        eos = hf.id_to_token(eos_token_ids[0]) if eos_token_ids else ""
        return cls(hf, chat_template, eos_token_ids, eos_token=eos or "")

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def apply_chat_template(self, prompt: str, system: str | None = None) -> str:
        """The prompt as one user turn (after an optional system turn), ready for the
        assistant's reply; the plain prompt when the model has no template."""
        if not self.chat_template:
            return prompt
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(messages=messages, add_generation_prompt=True,
                                                          bos_token=self.bos_token, eos_token=self.eos_token)


class StreamDecoder:
    """Turns a growing list of token ids into text pieces, holding back an incomplete
    UTF-8 sequence until its last byte arrives."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = 0

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self.emitted = text[self.emitted:], len(text)
        return piece
