"""Tokenizer and chat template, built from a GGUF file's metadata or a tokenizer.json."""

from __future__ import annotations

import jinja2
import jinja2.sandbox
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

GGUF_CONTROL = 3  # llama.cpp token type of special (control) tokens
MAX_TEMPLATE_OUTPUT = 1 << 26  # bytes a string or list product may reach inside a chat template


class _TemplateEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """A chat template comes with the model file: it runs sandboxed (no attribute access to
    Python internals, no mutation, range() capped by jinja2), and `*` / `**` that would build a
    huge string or number are refused (a template is a few lines; its output is a prompt)."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
            raise jinja2.sandbox.SecurityError(f"the exponent {right} is too large")
        if operator == "*" and any(isinstance(x, (str, list, tuple)) for x in (left, right)):
            seq, n = (left, right) if isinstance(left, (str, list, tuple)) else (right, left)
            if isinstance(n, int) and len(seq) * n > MAX_TEMPLATE_OUTPUT:
                raise jinja2.sandbox.SecurityError(f"a repetition of {len(seq) * n} items is too large")
        return super().call_binop(context, operator, left, right)


# Pre-tokenizers that pass every byte of the text on to the model (the others drop whitespace
# or delimiters, so a text of n bytes may be far fewer than n / max_token_bytes tokens).
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Digits", "Sequence", "Metaspace", "Punctuation", "UnicodeScripts", "Split"}


def _keeps_every_byte(hf: HFTokenizer) -> bool:
    import json

    def keeps(node) -> bool:
        if node is None:
            return True
        if node.get("type") not in _KEEPING_PRE_TOKENIZERS or node.get("behavior") == "Removed":
            return False
        return all(keeps(p) for p in node.get("pretokenizers", []))

    try:
        return keeps(json.loads(hf.to_str()).get("pre_tokenizer"))
    except (ValueError, AttributeError, TypeError):
        return False


def _raise_exception(message):  # transformers' templates call it to reject a conversation
    raise jinja2.TemplateError(message)


def compile_template(text: str) -> jinja2.Template:
    """The chat template, compiled once (a syntax error is a ValueError naming its line)."""
    env = _TemplateEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(text)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(
            f"chat template is not valid jinja (line {e.lineno}: {' '.join(str(e.message).split())})"
        ) from None
    except (jinja2.TemplateError, RecursionError, MemoryError) as e:
        raise ValueError(f"chat template is not valid jinja ({type(e).__name__})") from None


class Tokenizer:
    def __init__(
        self,
        hf: HFTokenizer,
        chat_template: str | None,
        eos_token_ids: tuple[int, ...],
        bos_token: str = "",
        eos_token: str = "",
        source: str = "the model",
        prompt_prefix: tuple[int, ...] = (),
    ):
        self.hf = hf
        # Ids put before a prompt's tokens (Gemma's <bos> where no chat template writes it).
        self.prompt_prefix = list(prompt_prefix)
        self.chat_template = chat_template
        self.eos_token_ids = eos_token_ids
        self.bos_token, self.eos_token = bos_token, eos_token
        self.source = source  # the file the tokenizer and template came from (for error messages)
        self._template = compile_template(chat_template) if chat_template else None
        self._max_token_bytes = None

    @classmethod
    def from_gguf_fields(
        cls,
        tokens: list[str],
        token_types: list[int],
        merges: list[str],
        pre: str,
        chat_template: str | None,
        eos_token_ids: tuple[int, ...],
        source: str = "the model",
    ) -> "Tokenizer":
        """A byte-level BPE (llama.cpp's "gpt2" tokenizer model)."""
        vocab = {tok: i for i, tok in enumerate(tokens)}
        pairs = [tuple(m.split(" ", 1)) for m in merges]
        hf = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        # SmolLM's pre-tokenizer splits digits one by one before the GPT-2 regex.
        hf.pre_tokenizer = (
            pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
            if pre == "smollm"
            else byte_level
        )
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens(
            [
                AddedToken(tokens[i], special=True, normalized=False)
                for i, t in enumerate(token_types)
                if t == GGUF_CONTROL
            ]
        )
        eos = tokens[eos_token_ids[0]] if eos_token_ids else ""
        return cls(hf, chat_template, eos_token_ids, eos_token=eos, source=source)

    @classmethod
    def from_files(
        cls, tokenizer_json: str, chat_template: str | None, eos_token_ids: tuple[int, ...], source: str | None = None
    ) -> "Tokenizer":
        hf = HFTokenizer.from_file(tokenizer_json)
        eos = hf.id_to_token(eos_token_ids[0]) if eos_token_ids else ""
        return cls(hf, chat_template, eos_token_ids, eos_token=eos or "", source=source or tokenizer_json)

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    @property
    def max_token_bytes(self) -> int | None:
        """An upper bound of the text bytes one token covers, or None where there is none: a text
        of n bytes is then at least n / max_token_bytes tokens, a bound that costs nothing next to
        tokenizing a huge prompt. A token's vocabulary entry (UTF-8) covers at most its own bytes
        in a byte-level or BPE vocabulary; an unknown-token that swallows whole words (WordLevel,
        fused BPE unknowns, Unigram) has no bound; WordPiece's covers at most
        max_input_chars_per_word characters; a normalizer may shrink the text (NFC), so x4."""
        if self._max_token_bytes is None:
            model, bound = (
                self.hf.model,
                max([len(t.encode("utf-8", "surrogatepass")) for t in self.hf.get_vocab()] + [4]),
            )
            if not _keeps_every_byte(self.hf):
                sound = False
            elif isinstance(model, models.BPE):
                sound = model.unk_token is None or not model.fuse_unk
            elif isinstance(model, models.WordPiece):
                sound, bound = True, max(bound, 4 * model.max_input_chars_per_word)
            else:
                sound = False
            self._max_token_bytes = (bound * (4 if self.hf.normalizer is not None else 1)) if sound else 0
        return self._max_token_bytes or None

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def apply_chat_template(self, prompt: str, system: str | None = None) -> str:
        """The prompt as one user turn (after an optional system turn), ready for the
        assistant's reply; the plain prompt when the model has no template."""
        if self._template is None:
            return prompt
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        try:
            text = self._template.render(
                messages=messages, add_generation_prompt=True, bos_token=self.bos_token, eos_token=self.eos_token
            )
        except (
            jinja2.TemplateError,
            TypeError,
            ValueError,
            LookupError,
            ArithmeticError,
            AttributeError,
            RecursionError,
            MemoryError,
        ) as e:
            raise ValueError(
                f"{self.source}: its chat template fails on this prompt ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:200]})"
            ) from None
        if not isinstance(text, str):
            raise ValueError(f"{self.source}: its chat template did not produce text")
        return text


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
        piece, self.emitted = text[self.emitted :], len(text)
        return piece
