"""An offline Qwen3-VL processor directory for Bridge's own mock VLM dataset (data=bridge_mock).

Bridge's MockVLMSFTDataset loads `AutoProcessor.from_pretrained(hf_processor_path)`
(megatron/bridge/data/builders/mock_vlm_sft.py:154-160) and its collate renders each conversation
with the processor's chat template, tokenizes it and runs the image processor
(models/qwen_vl/data/collate_fn.py). There is no hub here, so this builds, from the model's
config alone, a directory that AutoProcessor loads as a Qwen3VLProcessor:

- the image and video processors of the Qwen3-VL family (patch, merge and temporal sizes from the
  model; Qwen3-VL's normalisation, mean = std = 0.5);
- a byte-level BPE tokenizer trained here on the mock's own words (each of its answer words, the
  prompt's words and the chat roles are single tokens, as in Qwen's 151k-entry vocabulary) whose
  special tokens sit at Qwen's ids (<|endoftext|> 151643 ... <|image_pad|> 151655, the ids the
  model config names), the vocabulary padded with unreachable entries up to them;
- the ChatML rendering Qwen3-VL-Instruct's template gives a user turn of images and text and an
  assistant turn of text (no system prompt, no tools: the mock has neither).

The text is NOT Qwen's tokenization of arbitrary text: only the mock's words are single tokens
(anything else splits into bytes). Token counts of the mock's samples match Qwen's (one token per
common English word with its leading space); tests/megatron/test_bridge_mock.py runs Bridge's own
dataset and collate on it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from moe_vlm.config.schema import ModelConfig

# Qwen2/3 special tokens in id order from 151643 (the vocabulary's first 151643 ids are BPE tokens).
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip
FIRST_SPECIAL_ID = 151643
PROMPT = "Describe this image."  # the recipes' (recipes/qwen_vl/h100/qwen3_vl.py:117-127)
# What the chat template renders around the turns.
CHAT_WORDS = ("user", "assistant", "system", "\n")
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif content['type'] == 'video' or 'video' in content -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in content -%}{{- content['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def mock_words() -> list[str]:
    """The words Bridge's mock answers are drawn from (its own list), the prompt's and the roles'."""
    from megatron.bridge.data.builders.mock_vlm_sft import _MOCK_RESPONSE_VOCABULARY

    return [*_MOCK_RESPONSE_VOCABULARY, *PROMPT.replace(".", " .").split(), *CHAT_WORDS]


def _tokenizer_json(words: list[str]) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    # Every word alone and after a space, often enough that each becomes one token.
    corpus = [f"{w} {w}" for w in words for _ in range(4)]
    trainer = trainers.BpeTrainer(
        vocab_size=256 + 8 * len(words),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
        min_frequency=1,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    payload = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = payload["model"]["vocab"]
    # Unreachable fillers (no merge produces them) up to Qwen's first special id.
    for i in range(len(vocab), FIRST_SPECIAL_ID):
        vocab[f"<|unused_{i}|>"] = i
    tokenizer = Tokenizer.from_str(json.dumps(payload))
    added = tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    assert added == len(SPECIAL_TOKENS)
    assert tokenizer.token_to_id("<|image_pad|>") == FIRST_SPECIAL_ID + SPECIAL_TOKENS.index("<|image_pad|>")
    return tokenizer.to_str()


def build_processor(model: ModelConfig, words: list[str]) -> object:
    """A Qwen3VLProcessor for `model` with the tokenizer above (not yet saved)."""
    from tokenizers import Tokenizer
    from transformers import Qwen2Tokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tokenizer = Qwen2Tokenizer(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(words)),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    sizes = {
        "patch_size": model.vision_patch_size,
        "temporal_patch_size": model.vision_temporal_patch_size,
        "merge_size": model.vision_spatial_merge_size,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(**sizes),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(**sizes),
        chat_template=CHAT_TEMPLATE,
    )


def write_processor(model: ModelConfig, directory: Path) -> Path:
    """Save the processor into `directory` (created once; every rank may call this at the same time:
    each builds in a temporary sibling and renames it into place, the first rename wins)."""
    if (directory / "tokenizer.json").is_file():
        return directory
    directory.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        build_processor(model, mock_words()).save_pretrained(str(scratch))  # type: ignore[attr-defined]
        try:
            os.rename(scratch, directory)
        except OSError:  # another rank's directory is in place: the same content
            if not (directory / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return directory
