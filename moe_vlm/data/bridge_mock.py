"""data=bridge_mock on the torch engine: samples shaped as Bridge's perf-recipe mock.

Bridge's MockVLMSFTDataset (megatron/bridge/data/builders/mock_vlm_sft.py; the Megatron engine
runs it itself) draws, from numpy's default_rng(0), 1,000 base examples, each an answer of
10-29 words (`integers(10, 30)`; 10-99 words, `integers(10, 100)`, when the dataset packs,
`enable_in_batch_packing`, :110), those words, and one 256x256 noise image, and cycles over them. Its collate renders each as a ChatML conversation, `<|im_start|>user\\n`, the image
(`<|vision_start|>`, 196 `<|image_pad|>`, `<|vision_end|>`), "Describe this image."
(4 tokens), `<|im_end|>\\n<|im_start|>assistant\\n`, the answer (one token per word),
`<|im_end|>\\n`, and pads the row to seq_length.

Here sample i has the same shape: one 256x256 noise image, which the image processor, bounded by
the collate's min_pixels / max_pixels (conf/data/bridge_mock.yaml), turns into the same
1 x 28 x 28 grid, and 14 + N_i text tokens, N_i the answer length Bridge's generator gives example
i mod 1,000 (replayed here draw for draw, so row lengths match Bridge's one by one:
tests/megatron/test_bridge_mock.py). Pixel values and token ids are this project's (noise and
byte ids); the loss covers the text, where Bridge's covers the answer. Labelled mock.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from moe_vlm.config.schema import Packing
from moe_vlm.data.tokenizer import BYTE_VOCAB

if TYPE_CHECKING:
    from moe_vlm.data.sequence import RawSample

BRIDGE_MOCK_STREAM = 11


@dataclass(frozen=True)
class BridgeMock:
    """Bridge's mock workload, as mock_vlm_sft.py draws it (megatron-bridge 0.6.2)."""

    random_seed: int = 0  # MockVLMSFTDatasetConfig.random_seed
    base_examples: int = 1000  # num_base_examples
    image_size: tuple[int, int] = (256, 256)  # (width, height)
    answer_words: tuple[int, int] = (10, 30)  # numpy integers' [low, high); packed: PACKED_ANSWER_WORDS
    vocabulary_size: int = 110  # len(_MOCK_RESPONSE_VOCABULARY): rng.choice's draws depend on it
    # Chat tokens around the turns (3 + 2 + 3 + 2) and the prompt "Describe this image." (4).
    text_tokens_besides_answer: int = 14
    image_tokens: int = 196  # 784 patches / 2 x 2 merge, Qwen3-VL (patch 16) at 448 x 448
    min_pixels: int = 200704  # the Qwen-VL collate's (models/qwen_vl/data/collate_fn.py:41-42)
    max_pixels: int = 1003520

    def answer_length(self, index: int) -> int:
        return _answer_lengths(self)[index % self.base_examples]

    def real_tokens(self, index: int) -> int:
        """Tokens of sample `index` before padding: image block, chat tokens, prompt and answer."""
        return self.image_tokens + 2 + self.text_tokens_besides_answer + self.answer_length(index)


BRIDGE_MOCK = BridgeMock()
# With enable_in_batch_packing Bridge draws longer answers, so packing has something to pack
# (mock_vlm_sft.py:110): mean ~278 real tokens a sample where the padded mock has ~232.
PACKED_ANSWER_WORDS = (10, 100)
BRIDGE_MOCK_PACKED = replace(BRIDGE_MOCK, answer_words=PACKED_ANSWER_WORDS)


def bridge_mock(packing: Packing) -> BridgeMock:
    """The workload Bridge's mock draws for this packing mode."""
    return BRIDGE_MOCK if packing is Packing.none else BRIDGE_MOCK_PACKED


@functools.cache
def _answer_lengths(mock: BridgeMock) -> tuple[int, ...]:
    """Replays make_mock_vlm_examples' draws (mock_vlm_sft.py:106-112): length, words, image."""
    import numpy  # here, not at import: the memory estimate reads BRIDGE_MOCK in every dry run

    rng = numpy.random.default_rng(seed=mock.random_seed)
    width, height = mock.image_size
    lengths = []
    for _ in range(mock.base_examples):
        length = int(rng.integers(*mock.answer_words))
        rng.choice(mock.vocabulary_size, size=length)
        rng.integers(low=0, high=256, size=(height, width, 3), dtype=numpy.uint8)
        lengths.append(length)
    return tuple(lengths)


def bridge_mock_sample(index: int, attempt: int = 0, mock: BridgeMock = BRIDGE_MOCK) -> RawSample:
    # torch here, not at import: the memory estimate reads BRIDGE_MOCK in every dry run and plan.
    import torch

    from moe_vlm.data.indexed import sample_generator
    from moe_vlm.data.sequence import RawSample

    generator = sample_generator(mock.random_seed, BRIDGE_MOCK_STREAM, index, attempt)
    width, height = mock.image_size
    image = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)
    count = mock.text_tokens_besides_answer + mock.answer_length(index)
    text = torch.randint(0, BYTE_VOCAB, (count,), generator=generator).tolist()
    key = f"bridge_mock/{index}" + (f"/redraw{attempt}" if attempt else "")
    return RawSample(key=key, images=[image], text_ids=text)
