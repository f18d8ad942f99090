"""The Megatron engine's data path, on CPU, through the real library.

- data=mock / data=synthetic reach Bridge as our DatasetProvider (engines/megatron/data.py), which
  Bridge's own dispatch, pre-flight and sampler take as they are;
- for one seed, the batches Bridge's loader builds from it (real MegatronPretrainingSampler, real
  DataLoader worker processes) hold the very samples the torch engine feeds the same data-parallel
  rank: equal token ids and pixel values, and equal token and patch statistics as each engine
  counts them (the torch engine's BatchStats; the Megatron engine's CountingIterator);
- building those datasets holds no samples in host memory, where Bridge's mock pre-generates;
- Bridge's Qwen3-VL path never packs (the evidence behind rule A008);
- on the Energon path (data=real) the table's max_visual_tokens=None removes the image-processor
  run inside encode_sample, counted on real photos from scripts/build_dataset.py.
"""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import warnings
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch

from moe_vlm.config.spec import RunSpec
from moe_vlm.data import build_batches
from moe_vlm.engines.megatron.config import apply_overrides, check_overrides
from moe_vlm.rules import validate
from tests.conftest import REPO, make_spec
from tests.megatron.conftest import REPORT, RecipeCache, model_parallel_rank, needs_stack

pytestmark = needs_stack

# 2 GB200 nodes = 8 GPUs, FSDP: DP = 8. Workers explicit: real worker processes on any machine.
BASE = ("engine=megatron", "dry_run=true", "model=qwen3_vl_30b_a3b", "cluster=gb200", "nodes=2")
WORKERS = "data.num_workers=2"


def built(recipes: RecipeCache, *overrides: str) -> tuple[RunSpec, Any]:
    spec = make_spec(*overrides)
    cfg = recipes.config(spec)
    apply_overrides(cfg, spec)
    return spec, cfg


def train_dataset(cfg: Any) -> Any:
    """What Bridge's setup builds: get_dataset_provider on cfg.dataset, for the run's sample count."""
    from megatron.bridge.data.loaders import get_train_valid_test_num_samples
    from megatron.bridge.data.utils import get_dataset_provider

    train, valid, test = get_dataset_provider(cfg.dataset)(
        list(get_train_valid_test_num_samples(cfg)), cfg.dataset
    )
    assert valid is None and test is None  # the table sets eval_iters=0
    return train


def bridge_loader(cfg: Any, dataset: Any, dp_rank: int, dp_size: int) -> Any:
    """Bridge's train loader for one DP rank, as data/loaders.py:321-337 builds it."""
    from megatron.bridge.data.samplers import build_pretraining_data_loader

    return build_pretraining_data_loader(
        dataset,
        0,
        cfg.dataset.dataloader_type,
        cfg.train.micro_batch_size,
        cfg.dataset.num_workers,
        cfg.dataset.data_sharding,
        collate_fn=dataset.collate_fn if hasattr(dataset, "collate_fn") else None,
        pin_memory=False,  # no accelerator to pin for
        persistent_workers=cfg.dataset.persistent_workers,
        data_parallel_rank=dp_rank,
        data_parallel_size=dp_size,
        global_batch_size=cfg.train.global_batch_size,
    )


@pytest.mark.parametrize("kind", ["mock", "synthetic"])
def test_seeded_data_is_a_dataset_bridge_builds(
    recipes: RecipeCache, engine_environment: Any, kind: str
) -> None:
    from megatron.bridge.data.base import DatasetProvider
    from megatron.bridge.training.config import runtime_config_update

    from moe_vlm.data.workers import data_workers

    spec, cfg = built(recipes, *BASE, f"data={kind}")
    assert type(cfg.dataset).__name__ == "MoeVlmDatasetConfig" and isinstance(cfg.dataset, DatasetProvider)
    assert check_overrides(cfg, spec) == []
    assert not hasattr(cfg.dataset, "hf_processor_path")  # no processor files needed: byte tokens
    engine_environment(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runtime_config_update(cfg)  # Bridge's pre-flight: ConfigContainer.validate, dataset finalize
    workers = data_workers(spec).count
    assert cfg.dataset.num_workers == workers >= 1 and cfg.dataset.persistent_workers is True
    assert cfg.dataset.kind == kind and cfg.dataset.dataloader_type == "single"
    assert type(train_dataset(cfg)).__name__ == "SeededSamples"


@pytest.mark.parametrize("kind", ["synthetic", "mock"])
def test_megatron_batches_are_the_torch_engine_s(
    recipes: RecipeCache, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    from megatron.bridge.models.qwen_vl.qwen3_vl_step import get_batch

    from moe_vlm.data.batch import BATCH_COUNTS
    from moe_vlm.engines.megatron.recording import CountingIterator, StepStats

    spec, cfg = built(recipes, *BASE, f"data={kind}", "mbs=2", WORKERS)
    dataset = train_dataset(cfg)
    dp, batches = spec.layout.dp, 2
    compared = 0
    for dp_rank in (0, dp - 1):
        stats = StepStats()
        loader = iter(bridge_loader(cfg, dataset, dp_rank, dp))
        megatron = CountingIterator(loader, stats, spec.model.pad_token_id, spec.model.image_token_id)
        torch_engine = build_batches(spec, dp_rank, dp)
        for theirs, ours in islice(zip(megatron, torch_engine, strict=False), batches):
            counted = StepStats()
            counted.add_batch(theirs, spec.model.pad_token_id, spec.model.image_token_id)
            s = ours.stats
            # The same counts under the same names (StepStats is a BatchStats), bar what Bridge's
            # batch does not show: samples, vision markers, truncation.
            hidden = ("samples", "vision_marker_tokens", "truncated_text_tokens")
            shown = [name for name in BATCH_COUNTS if name not in hidden]
            assert {k: getattr(counted, k) for k in shown} == {k: getattr(s, k) for k in shown}
            assert torch.equal(theirs["input_ids"], ours.input_ids)
            visual = theirs["visual_inputs"]
            if kind == "synthetic":
                assert ours.image_grid_thw is not None and ours.pixel_values is not None
                assert torch.equal(visual.image_grid_thw, ours.image_grid_thw)
                assert torch.equal(visual.pixel_values, ours.pixel_values)
                assert s.images >= spec.mbs  # 1-2 images per sample
            else:
                assert visual.pixel_values is None and s.images == 0
            compared += s.samples
        assert stats.micro_batches == batches

    # Bridge's Qwen3-VL step reads the batch as it reads its own collate's (the device move is the
    # identity here: there is no device).
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *args, **kwargs: self)
    batch = next(iter(bridge_loader(cfg, dataset, 0, dp)))
    expected = next(build_batches(spec, 0, dp))
    tokens, labels, loss_mask, _attention, _positions, visual_inputs = get_batch(
        iter([batch]), cfg, is_first_pp_stage=True, is_last_pp_stage=True
    )
    assert torch.equal(tokens, expected.input_ids)
    assert torch.equal(labels[:, :-1], expected.labels[:, 1:])  # Megatron predicts labels[t] at t
    assert int(loss_mask.sum()) == expected.stats.loss_tokens
    if kind == "synthetic":
        assert expected.image_grid_thw is not None
        assert torch.equal(visual_inputs["image_grid_thw"], expected.image_grid_thw)
    REPORT.append(
        f"data={kind}: {compared} samples through Bridge's sampler and {cfg.dataset.num_workers} loader "
        "workers equal the torch engine's (token ids, pixels, token and patch statistics)"
    )


def held_bytes(value: Any) -> int:
    """The bytes an object holds, as pickling it writes them (what a spawned worker would receive)."""
    return len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def test_seeded_datasets_hold_no_samples(recipes: RecipeCache) -> None:
    """Host memory per rank: ours holds no samples; Bridge's mock holds every base example's images."""
    from megatron.bridge.data.builders.mock_vlm_sft import MockVLMSFTDatasetConfig, make_mock_vlm_examples

    held = {}
    for kind in ("mock", "synthetic"):
        spec, cfg = built(recipes, *BASE, f"data={kind}")
        dataset = train_dataset(cfg)
        assert len(dataset) == spec.gbs * spec.train_iters == 4096
        held[kind] = held_bytes(dataset)
    ours = max(held.values())

    # What the engine configured before: Bridge's mock with the rounded-up mean image count and the
    # mid-range side, on every rank (data/loaders.py:267 builds datasets on all ranks).
    recipe = recipes.config(spec).dataset
    assert isinstance(recipe, MockVLMSFTDatasetConfig)
    old = copy.deepcopy(recipe)
    old.num_images, old.image_size = 2, (840, 840)
    per_example = old.num_images * 840 * 840 * 3
    old.num_base_examples = 16  # the library default is 1000
    theirs = held_bytes(make_mock_vlm_examples(old))
    assert theirs >= 16 * per_example  # the measure sees pre-generated images
    assert ours < 2**20, f"a seeded dataset holds {ours / 2**20:.1f} MiB"
    REPORT.append(
        f"host memory: our mock/synthetic datasets for {len(dataset)} samples hold {ours / 2**10:.0f} KiB; Bridge's "
        f"mock held {per_example / 2**20:.1f} MiB per base example (16: {theirs / 2**20:.0f} MiB; "
        f"num_base_examples={recipe.num_base_examples}: {recipe.num_base_examples * per_example / 2**30:.1f} GiB)"
    )


# --- packing: what Bridge's Qwen3-VL step does with in-batch packing (rule A008) ----------------


@pytest.fixture(scope="module")
def one_rank() -> Iterator[Any]:
    from megatron.core.process_groups_config import ProcessGroupCollection

    with model_parallel_rank():
        yield ProcessGroupCollection.use_mpu_process_groups()


def test_bridge_s_qwen3_vl_path_never_packs(one_rank: Any) -> None:
    from megatron.bridge.data.datasets.direct_sft import DirectSFTDataset
    from megatron.bridge.models.qwen_vl.qwen3_vl_step import (
        _pad_and_pack_qwen3_vl_step,
        get_batch_from_iterator,
    )

    # 1. The collate is told not to pack when packing is deferred to the step (direct_sft.py:91).
    seen: dict[str, Any] = {}

    def collate(batch: list[Any], processor: Any, **kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return {}

    DirectSFTDataset(
        [{}], 1, None, collate_impl=collate, enable_in_batch_packing=True, defer_in_batch_packing_to_step=True
    ).collate_fn([{}])
    assert seen["enable_in_batch_packing"] is False
    # 2. The step refuses a batch packed at collate time (qwen3_vl_step.py:61-65).
    with pytest.raises(ValueError, match="does not support collate-time in-batch packing"):
        get_batch_from_iterator(
            iter([{"input_ids": torch.ones(1, 8), "cu_seqlens": torch.tensor([0, 8])}]),
            is_first_pp_stage=True,
            is_last_pp_stage=True,
        )
    # 3. So the step's own "packing" makes one segment per padded row (qwen3_vl_step.py:192-197):
    # two samples of 3 and 5 real tokens stay in two rows of 8, padding included.
    tokens = torch.tensor([[1, 2, 3, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 0, 0, 0]])
    mask = (tokens > 0).long()
    *_, params = _pad_and_pack_qwen3_vl_step(
        tokens, tokens.clone(), mask.float(), mask, torch.arange(8).expand(2, -1), one_rank
    )
    assert params.cu_seqlens_q.tolist() == [0, 8, 16] and params.qkv_format == "thd"
    # Hence data.packing=in_batch runs vlm_step (tests/megatron/test_packing.py), and A008 says so.
    assert "A008" in {f.code for f in validate(make_spec(*BASE, "data.packing=in_batch", "mbs=2"))}


# --- Energon (data=real): the image processor's runs per sample --------------------------------

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<|vision_start|><|image_pad|>"
    "<|vision_end|>{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}"
)


def qwen3_vl_checkpoint(directory: Path, spec: RunSpec) -> Path:
    """A local checkpoint directory: the model's config.json and Qwen3VLProcessor files made here (a
    byte-level BPE tokenizer with Qwen's special tokens and a ChatML template stand in for the hub's,
    which are not here offline; the image processor is the project's Qwen3-VL one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3VLProcessor, Qwen3VLVideoProcessor

    from moe_vlm.data.vision import ImagePreprocessor
    from moe_vlm.engines.hf_config import write_hf_config

    write_hf_config(spec.model, directory)

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    bpe = Tokenizer(models.BPE(vocab={char: i for i, char in enumerate(alphabet)}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"],
    )
    Qwen3VLProcessor(
        image_processor=ImagePreprocessor(spec.model, spec.data).processor,
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(),
        chat_template=CHATML,
    ).save_pretrained(directory)
    return directory


def test_energon_runs_the_image_processor_once_less_per_sample(
    recipes: RecipeCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import megatron.energon as energon
    from megatron.bridge.data.builders.energon import build_energon_task_encoder

    photos = tmp_path / "photos"
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "build_dataset.py"), "--skimage", str(photos)],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    probe = make_spec(*BASE, "data=real", f"data.path={photos}")
    processor_dir = qwen3_vl_checkpoint(tmp_path / "checkpoint", probe)
    _, cfg = built(recipes, *BASE, "data=real", f"data.path={photos}", f"model.hf_model_id={processor_dir}")
    assert cfg.dataset.task_encoder.max_visual_tokens is None  # THE table's row

    worker = energon.WorkerConfig(rank=0, world_size=1, num_workers=0)
    # dataset.yaml: ChatMLWebdataset, what Bridge's Qwen-VL task encoder reads
    raw = energon.get_train_dataset(
        str(photos), batch_size=None, shuffle_buffer_size=None, max_samples_per_sequence=None,
        worker_config=worker, split_part="train",
    )  # fmt: skip
    samples = list(islice(iter(energon.get_loader(raw)), 3))

    def runs(max_visual_tokens: int | None) -> tuple[int, int, Any]:
        """Images the processor handled in encode_sample and in the batch collate, for `samples`."""
        dataset = copy.deepcopy(cfg.dataset)
        dataset.task_encoder.max_visual_tokens = max_visual_tokens
        encoder = build_energon_task_encoder(dataset)  # Bridge's builder: AutoTokenizer + Qwen3VLProcessor
        image_processor = type(encoder.image_processor.image_processor)
        handled: list[int] = []
        original = image_processor.__call__

        def counting(self: Any, images: Any, *args: Any, **kwargs: Any) -> Any:
            handled.append(sum(len(i) if isinstance(i, list) else 1 for i in images))
            return original(self, images, *args, **kwargs)

        monkeypatch.setattr(image_processor, "__call__", counting)
        encoded = [encoder.encode_sample(sample) for sample in samples]
        in_encode = sum(handled)
        batch = encoder.batch(encoded)
        monkeypatch.setattr(image_processor, "__call__", original)
        return in_encode, sum(handled) - in_encode, batch

    budget_encode, budget_collate, budget_batch = runs(16384)  # QwenVLEnergonTaskEncoderConfig's default
    ours_encode, ours_collate, ours_batch = runs(cfg.dataset.task_encoder.max_visual_tokens)
    assert (budget_encode, ours_encode) == (len(samples), 0)
    assert ours_collate == budget_collate >= len(samples)
    assert torch.equal(ours_batch.input_ids, budget_batch.input_ids)
    assert torch.equal(ours_batch.visual_inputs.pixel_values, budget_batch.visual_inputs.pixel_values)
    REPORT.append(
        f"Energon: image-processor runs per sample {(budget_encode + budget_collate) / len(samples):g} -> "
        f"{ours_collate / len(samples):g} (encode_sample {budget_encode // len(samples)} -> 0; Bridge's collate "
        f"{ours_collate / len(samples):g}: the batch call, plus its assistant loss mask rendering the "
        "conversation through the processor, data/conversation_processing.py:1567-1574)"
    )
