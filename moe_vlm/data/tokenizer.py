"""A tokenizer that needs no download: UTF-8 bytes as token ids.

Ids 0..255 are the bytes of the text; every Qwen3-VL special id (image placeholder,
vision start/end, padding) sits above them in any real or tiny vocabulary, so text can
never be mistaken for an image token. One token per byte is more tokens per caption than
the real BPE tokenizer gives, but it is the same for every data kind, which is what makes
their token counts comparable.
"""

from __future__ import annotations

from moe_vlm.config.schema import ModelConfig
from moe_vlm.data.errors import TokenizerMismatch

BYTE_VOCAB = 256


class ByteTokenizer:
    def __init__(self, model: ModelConfig) -> None:
        special = {
            "image_token_id": model.image_token_id,
            "vision_start_token_id": model.vision_start_token_id,
            "vision_end_token_id": model.vision_end_token_id,
            "pad_token_id": model.pad_token_id,
        }
        clashes = [f"{name}={value}" for name, value in special.items() if value < BYTE_VOCAB]
        if model.vocab_size <= BYTE_VOCAB or clashes:
            raise TokenizerMismatch(
                f"model={model.name}: byte-level text ids 0..{BYTE_VOCAB - 1} need vocab_size > {BYTE_VOCAB} "
                f"(has {model.vocab_size}) and special ids above them "
                f"(clashing: {', '.join(clashes) or 'none'}). "
                "Fix: move the model's special token ids to >= 256."
            )
        outside = [f"{name}={value}" for name, value in special.items() if value >= model.vocab_size]
        if outside:
            raise TokenizerMismatch(
                f"model={model.name}: special ids {', '.join(outside)} "
                f"are outside vocab_size={model.vocab_size}. "
                "Fix: raise model.vocab_size or correct the ids."
            )
        self.image_token_id = model.image_token_id
        self.vision_start_token_id = model.vision_start_token_id
        self.vision_end_token_id = model.vision_end_token_id
        self.pad_token_id = model.pad_token_id

    @staticmethod
    def encode(text: str) -> list[int]:
        return list(text.encode("utf-8"))

    @staticmethod
    def decode(ids: list[int]) -> str:
        return bytes(i for i in ids if i < BYTE_VOCAB).decode("utf-8", errors="replace")
