"""Mock data: image-free text that fills seq_length/2 .. seq_length of each row.

It keeps the decoder busy with as many tokens as a real sequence but asks nothing of the
vision encoder, which is exactly why it runs faster than real multimodal input (by how much:
data.stats.MOCK_SPEEDUP) and is never a performance proxy for a VLM. Every batch is labelled
data_kind="mock". Sample i is a function of (seed, i), the same on both engines (data/indexed.py);
the Megatron engine feeds these samples too, not Bridge's MockVLMSFTDataset.
"""

from __future__ import annotations

import torch

from moe_vlm.data.indexed import sample_generator
from moe_vlm.data.sequence import RawSample
from moe_vlm.data.tokenizer import BYTE_VOCAB

MOCK_STREAM = 3


def mock_sample(seed: int, seq_length: int, index: int, attempt: int = 0) -> RawSample:
    generator = sample_generator(seed, MOCK_STREAM, index, attempt)
    length = int(torch.randint(seq_length // 2, seq_length + 1, (1,), generator=generator))
    text = torch.randint(0, BYTE_VOCAB, (length,), generator=generator).tolist()
    key = f"mock/{index}" + (f"/redraw{attempt}" if attempt else "")
    return RawSample(key=key, images=[], text_ids=text)
