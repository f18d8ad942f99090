"""Mock data: image-free text, what Bridge's MockVLMSFTDatasetConfig(num_images=0) gives.

It keeps the decoder busy with as many tokens as a real sequence but asks nothing of the
vision encoder, which is exactly why it runs about 2x faster than real multimodal input
and is never a performance proxy for a VLM. Every batch is labelled data_kind="mock".
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from moe_vlm.data.sequence import RawSample
from moe_vlm.data.tokenizer import BYTE_VOCAB


def mock_samples(seed: int, rank: int, seq_length: int) -> Iterator[RawSample]:
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    index = 0
    while True:
        length = int(torch.randint(seq_length // 2, seq_length + 1, (1,), generator=generator))
        text = torch.randint(0, BYTE_VOCAB, (length,), generator=generator).tolist()
        yield RawSample(key=f"mock/rank{rank}/{index}", images=[], text_ids=text)
        index += 1
