"""What both tokenizers share: the end-of-generation texts, the special-token partition of a text
(tokenizer_st_partition), decoding and streaming pieces as text (llama_token_to_piece)."""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

from bankml.errors import ModelRefused

# texts llama.cpp's vocab loader marks as end of generation (llama-vocab.cpp, special_eog_ids)
EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<｜end▁of▁sentence｜>", "[e~["}
# the FIM pad, repo and file-separator texts (end of generation too) and the other FIM texts: each
# made a control token (llama_vocab::impl::load)
FIMEOG_TEXTS = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>", "<|repo_name|>",
                  "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"}
FIM_TEXTS = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
              "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>",
              "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>",
              "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"}


def st_partition(text: str, specials: list[tuple[int, str]]) -> list[str | int]:
    """tokenizer_st_partition: each special text in turn (the caller's order) cuts the text
    fragments left so far, leftmost first; a fragment is a str, a special token its id."""
    frags: list[str | int] = [text] if text else []
    for sid, s in specials:
        if not s:
            continue
        new: list[str | int] = []
        for f in frags:
            if isinstance(f, int) or s not in f:
                new.append(f)
                continue
            for k, p in enumerate(f.split(s)):
                if k:
                    new.append(sid)
                if p:
                    new.append(p)
        frags = new
    return frags


class PieceVocab:
    """What every tokenizer builds on its `tokens` and `piece(tid, special)`: decode, stream,
    n_vocab; and its making from a GGUF header, which `refusal` (metadata, value types -> why not,
    or None) checks before `from_metadata` reads it."""

    tokens: list[str]
    refusal: Callable[[dict, dict], str | None]

    suppress_tokens: tuple[int, ...] = ()   # tokenizer.ggml.suppress_tokens in range: the sampler bans them

    @classmethod
    def from_gguf(cls, gguf, name: str = "model"):
        why = cls.refusal(gguf.metadata, gguf.value_types)
        if why:
            raise ModelRefused(f"{name}: {why}")
        tok = cls.from_metadata(gguf.metadata, name)
        suppress = gguf.metadata.get("tokenizer.ggml.suppress_tokens", ())
        tok.suppress_tokens = tuple(int(i) for i in suppress if 0 <= int(i) < len(tok.tokens))
        return tok

    @classmethod
    def from_metadata(cls, md: dict, name: str):
        raise NotImplementedError

    def piece(self, tid: int, special: bool = True) -> bytes:
        raise NotImplementedError

    def decode(self, ids: Iterable[int], special: bool = True) -> str:
        """The pieces of `ids` joined; bytes that are not UTF-8 become U+FFFD."""
        return b"".join(self.piece(i, special) for i in ids).decode("utf-8", "replace")

    def stream(self, ids: Iterable[int], special: bool = True) -> Iterator[str]:
        """Decode token by token, yielding text only once its UTF-8 sequence is complete."""
        dec = StreamDecoder(self, special)
        for i in ids:
            text = dec.push(i)
            if text:
                yield text
        tail = dec.flush()
        if tail:
            yield tail

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)


class StreamDecoder:
    """Holds back an incomplete UTF-8 sequence at the end until the next token completes it."""

    def __init__(self, tok: PieceVocab, special: bool = True):
        self.tok, self.special, self.pending = tok, special, b""

    def push(self, tid: int) -> str:
        buf = self.pending + self.tok.piece(tid, self.special)
        keep = _incomplete_tail(buf)
        self.pending = buf[len(buf) - keep:] if keep else b""
        return buf[:len(buf) - keep].decode("utf-8", "replace")

    def flush(self) -> str:
        out, self.pending = self.pending.decode("utf-8", "replace"), b""
        return out


def _incomplete_tail(buf: bytes) -> int:
    """How many bytes at the end start a UTF-8 sequence that is not yet complete."""
    for back in range(1, min(4, len(buf)) + 1):
        b = buf[-back]
        if b & 0xC0 == 0x80:
            continue                                # continuation byte: look further back
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0
