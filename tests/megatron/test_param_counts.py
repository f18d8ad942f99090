"""Our parameter counts against Megatron Core's own layers, built on the meta device (no memory).

The vision tower is Bridge's own Qwen3VLVisionModel (see vision_model below). Bridge's providers
build Transformer Engine modules, and TE refuses to construct without CUDA
(transformer_engine/pytorch/module/base.py:896 "TransformerEngine needs CUDA.", reached from
TEDotProductAttention in both the ViT, bridge qwen_vl/modelling_qwen3_vl/model.py:305, and the
decoder: the hybrid's full-attention spec is always TE, core/models/gpt/
experimental_attention_variant_module_specs.py:475). So the decoder is built here from the
provider's own TransformerConfig (the recipe's, every size as Bridge converted it from the HF
config) with Megatron Core's LOCAL modules: get_gpt_layer_local_submodules for attention and the
MoE (SequentialMLP experts, SharedExpertMLP), and the real GatedDeltaNet with a ColumnParallelLinear
in_proj and its input norm unfused (TE's LayerNormColumnParallelLinear holds the same two weights).
Parameter-neutral switches it needs on CPU: layernorm_zero_centered_gamma and persist_layer_norm
off (torch_norm.py:44-48),
gradient_accumulation_fusion off (tensor_parallel/layers.py:1071, needs APEX's CUDA extension),
the allgather dispatcher (the all-to-all one makes a CUDA stream, moe/token_dispatcher.py:469),
and torch.cuda.current_device answered with 'meta' (the GDN puts conv1d, dt_bias and A_log on it,
ssm/gated_delta_net/common.py:230-249).

What a tensor-parallel rank holds is read off the parameters themselves: Megatron Core marks every
split weight tensor_model_parallel (what lacks the mark, each TP rank holds whole), and routed experts
are the MoELayer's `experts` module, split over EP x ETP.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from moe_vlm.config.arch import is_full_attention
from moe_vlm.perf.memory.images import image_budget
from moe_vlm.perf.memory.megatron import megatron_stage
from moe_vlm.perf.memory.shared import param_counts
from tests.conftest import make_spec
from tests.megatron.conftest import REPORT, RecipeCache, model_parallel_rank, needs_stack, runtime_updated

pytestmark = needs_stack

MODELS = ("qwen3_vl_30b_a3b", "qwen3_vl_235b_a22b", "qwen35_vl_35b_a3b")
# The decoder's count is exact, so a rank's must be too (up to float rounding). Before the replicated
# parts were counted whole, ours was 0.94 % low on the 235B card's TP 8 rank, 0.23-0.33 % at TP 4.
RANK_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Counted:
    """One module's parameters as the library built them."""

    split: int  # marked tensor_model_parallel (dense): each TP rank holds 1/TP
    replicated: int  # no mark: each TP rank holds all
    experts: int  # routed experts: each rank holds 1/(EP x ETP)

    @property
    def dense(self) -> int:
        return self.split + self.replicated

    def __add__(self, other: Counted) -> Counted:
        return Counted(
            self.split + other.split, self.replicated + other.replicated, self.experts + other.experts
        )

    def per_rank(self, tp: int, ep_etp: int) -> float:
        return self.split / tp + self.replicated + self.experts / ep_etp


def count(module: Any, skip: frozenset[int] | set[int] = frozenset()) -> Counted:
    from megatron.core.transformer.moe.moe_layer import MoELayer

    experts = {id(p) for m in module.modules() if isinstance(m, MoELayer) for p in m.experts.parameters()}
    split = replicated = routed = 0
    for p in module.parameters():
        if id(p) in skip:
            continue
        if id(p) in experts:
            routed += p.numel()
        elif getattr(p, "tensor_model_parallel", False):
            split += p.numel()
        else:
            replicated += p.numel()
    return Counted(split, replicated, routed)


@dataclass(frozen=True)
class Library:
    """Megatron Core's decoder slice for one model: one layer of each kind, plus the ends."""

    config: Any
    layers: dict[int, Counted]  # by the layer index in the full model
    embedding: Counted
    output_layer: Counted
    final_norm: Counted
    vision: Counted  # Bridge's Qwen3VLVisionModel: patch and position embeddings, ViT blocks
    projector: Counted  # its patch merger and deepstack mergers


@functools.cache
def library(name: str) -> Library:
    import torch
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_submodules
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
    from megatron.core.transformer.transformer_layer import TransformerLayer

    spec = make_spec(f"model={name}")
    config = RecipeCache(Path(tempfile.mkdtemp())).config(spec).model
    full_pattern = getattr(config, "linear_attention_freq", None)
    # Layers 0..3 hold one of each kind (the hybrid's 4th is full attention).
    slice_layers = 4 if isinstance(full_pattern, list) else 1
    for key in ("tensor", "pipeline", "expert", "expert_tensor", "context"):
        setattr(config, f"{key}_model_parallel_size" if key != "context" else "context_parallel_size", 1)
    config.sequence_parallel = False
    full_layers, config.num_layers = config.num_layers, slice_layers
    if isinstance(full_pattern, list):
        config.linear_attention_freq = full_pattern[:slice_layers]
    config.use_cpu_initialization, config.perform_initialization = True, False
    config.layernorm_zero_centered_gamma = config.persist_layer_norm = False
    config.gradient_accumulation_fusion = False
    config.moe_permute_fusion, config.moe_token_dispatcher_type = False, "allgather"
    config.moe_grouped_gemm = False  # SequentialMLP: the same weights as TE's grouped GEMM
    config.finalize()

    norm = LocalSpecProvider().layer_norm(rms_norm=config.normalization == "RMSNorm")
    attention = get_gpt_layer_local_submodules(
        num_experts=config.num_moe_experts,
        moe_grouped_gemm=False,
        qk_layernorm=config.qk_layernorm,
        normalization=config.normalization,
    )
    gdn = ModuleSpec(
        module=GatedDeltaNet,
        submodules=GatedDeltaNetSubmodules(
            in_proj=ColumnParallelLinear, out_norm=norm, out_proj=RowParallelLinear
        ),
    )
    pattern = config.linear_attention_freq if isinstance(full_pattern, list) else [0] * slice_layers
    specs = [
        ModuleSpec(
            module=TransformerLayer,
            submodules=dataclasses.replace(attention, self_attention=gdn) if linear else attention,
        )
        for linear in pattern
    ]
    block = TransformerBlockSubmodules(layer_specs=specs, layer_norm=norm)
    with pytest.MonkeyPatch.context() as patch, model_parallel_rank():
        patch.setattr(torch.cuda, "current_device", lambda: "meta")
        with torch.device("meta"):
            model = GPTModel(
                config,
                block,
                vocab_size=config.vocab_size,
                max_sequence_length=config.seq_length,
                share_embeddings_and_output_weights=config.share_embeddings_and_output_weights,
                position_embedding_type="rope",
            )
    config.num_layers, config.linear_attention_freq = full_layers, full_pattern
    vision = vision_model(config)
    mergers = [vision.merger, *getattr(vision.decoder, "deepstack_merger_list", [])]
    merger_params = {id(p) for m in mergers for p in m.parameters()}
    return Library(
        config=config,
        layers={i: count(layer) for i, layer in enumerate(model.decoder.layers)},
        embedding=count(model.embedding),
        output_layer=count(model.output_layer),
        final_norm=count(model.decoder.final_layernorm),
        vision=count(vision, skip=merger_params),
        projector=sum((count(m) for m in mergers), Counted(0, 0, 0)),
    )


def vision_model(config: Any) -> Any:
    """Bridge's own ViT (qwen_vl/modelling_qwen3_vl/vision_model.py) with the config Bridge derives for
    it (transformer_config.py get_vision_model_config), built as Qwen3VLModel builds it
    (model.py:305-326) but with Megatron Core's local ViT layer (vit_layer_specs.py
    get_vit_layer_with_local_spec) and local linears in the mergers in place of TE's."""
    import torch
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.attention import Qwen3VLSelfAttention
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_config import get_vision_model_config
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.utils import PatchMergerSubmodules
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    with model_parallel_rank():
        vision = get_vision_model_config(config.vision_config, megatron_config=config)
        vision.pipeline_model_parallel_size, vision.first_pipeline_num_layers = 1, None
        vision.gradient_accumulation_fusion = vision.persist_layer_norm = False
        vision.use_cpu_initialization, vision.perform_initialization = True, False
        layer = get_vit_layer_with_local_spec()
        layer.submodules.self_attention.module = Qwen3VLSelfAttention
        merger = PatchMergerSubmodules(
            patch_norm=LocalSpecProvider().layer_norm(rms_norm=False),
            linear_fc1=ColumnParallelLinear,
            linear_fc2=RowParallelLinear,
        )
        with torch.device("meta"):
            return Qwen3VLVisionModel(
                vision, layer, merger, pg_collection=ProcessGroupCollection.use_mpu_process_groups()
            )


@pytest.mark.parametrize("name", MODELS)
def test_layer_kinds_follow_the_providers_pattern(name: str) -> None:
    """Which layers are Gated DeltaNet: ours against the provider's linear_attention_freq."""
    model, config = make_spec(f"model={name}").model, library(name).config
    pattern = getattr(config, "linear_attention_freq", None)
    ours = [0 if is_full_attention(model, i) else 1 for i in range(model.num_layers)]
    assert ours == (pattern if isinstance(pattern, list) else [0] * config.num_layers)


@pytest.mark.parametrize("name", MODELS)
def test_each_layer_kind_counts_what_megatron_core_builds(name: str) -> None:
    model = make_spec(f"model={name}").model
    lib, ours = library(name), param_counts(model)
    for index, built in lib.layers.items():
        layer = ours.layers[index]
        kind = "attention" if is_full_attention(model, index) else "gated-delta-net"
        assert (layer.dense, layer.experts) == (built.dense, built.experts), (name, kind)
        # What each TP rank holds whole (norms, router, shared-expert gate).
        assert layer.replicated == built.replicated, (name, kind)
        REPORT.append(
            f"{name} {kind} layer: ours {layer.dense + layer.experts:,} = Megatron Core "
            f"{built.dense + built.experts:,} ({built.replicated:,} replicated over TP)"
        )
    assert ours.embedding == lib.embedding.dense
    assert ours.lm_head == lib.output_layer.dense
    assert ours.final_norm == lib.final_norm.replicated


@pytest.mark.parametrize("name", MODELS)
def test_vision_tower_and_mergers_count_what_bridge_builds(name: str) -> None:
    ours, lib = param_counts(make_spec(f"model={name}").model), library(name)
    assert (ours.vision, ours.vision_replicated) == (lib.vision.dense, lib.vision.replicated)
    assert (ours.projector, ours.projector_replicated) == (lib.projector.dense, lib.projector.replicated)
    REPORT.append(
        f"{name} vision tower + mergers: ours {ours.vision + ours.projector:,} = Bridge "
        f"{lib.vision.dense + lib.projector.dense:,}"
    )


def library_rank(name: str, spec: Any) -> float:
    """The library's parameters on the first stage's rank: its layers by kind, the ends."""
    lib, model = library(name), spec.model
    tp, ep_etp = max(spec.layout.tp, 1), max(spec.layout.ep, 1) * max(spec.layout.etp, 1)
    kinds = {is_full_attention(model, i): built for i, built in lib.layers.items()}
    total = sum(kinds[is_full_attention(model, i)].per_rank(tp, ep_etp) for i in spec.stage_layer_indices(0))
    total += sum(part.per_rank(tp, ep_etp) for part in (lib.embedding, lib.vision, lib.projector))
    if max(spec.layout.pp, 1) == 1:
        total += lib.output_layer.per_rank(tp, ep_etp) + lib.final_norm.per_rank(tp, ep_etp)
    return total


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("qwen3_vl_235b_a22b", ("card=qwen3_vl_3d_gb200",)),  # TP 8, EP 8, ETP 8
        ("qwen3_vl_30b_a3b", ("model=qwen3_vl_30b_a3b", "parallelism=3d", "tp=4", "ep=8")),
        ("qwen35_vl_35b_a3b", ("model=qwen35_vl_35b_a3b", "parallelism=3d", "tp=4", "ep=8")),
        ("qwen35_vl_35b_a3b", ("model=qwen35_vl_35b_a3b", "parallelism=3d", "ep=8")),  # the card's TP 1
    ],
)
def test_parameters_per_rank_match_the_library(name: str, overrides: tuple[str, ...]) -> None:
    """The memory estimate's `parameters` term (bf16, 3D: no DP sharding) over a rank's parameters."""
    spec = make_spec(*overrides, "precision=bf16")
    assert spec.model.name == name
    counts = param_counts(spec.model)
    estimate = megatron_stage(spec, 0, image_budget(spec), counts)
    (term,) = (t for t in estimate.terms if t.name == "parameters")
    ours = term.bytes / 2
    library_count = library_rank(name, spec)
    error = ours / library_count - 1
    REPORT.append(
        f"{name} per rank ({' '.join(overrides)}): ours {ours / 1e9:.4f}B, Megatron Core "
        f"{library_count / 1e9:.4f}B ({error:+.3%})"
    )
    assert abs(error) <= RANK_TOLERANCE, f"{error:+.3%}"


@pytest.mark.parametrize(
    "overrides",
    [
        ("card=qwen3_vl_3d_gb200",),
        ("model=qwen35_vl_35b_a3b", "parallelism=3d", "ep=8"),
        ("model=qwen35_vl_35b_a3b", "parallelism=3d", "ep=8", "overlap.grad_reduce_in_fp32=true"),
    ],
)
def test_state_bytes_per_parameter_are_the_engines_configs(
    recipes: RecipeCache, engine_environment: Any, overrides: tuple[str, ...]
) -> None:
    """12 B of optimizer state and the main-gradient width per parameter, from the ConfigContainer the
    engine builds after Bridge's runtime update (which carries mixed_precision's grad_reduce_in_fp32
    to ddp): the distributed optimizer keeps main weights, exp_avg and exp_avg_sq in its config's
    dtypes (megatron/core/optimizer/optimizer_config.py:197-206), the grad buffer in fp32 only with
    grad_reduce_in_fp32 (distributed/param_and_grad_buffer.py:917)."""
    from moe_vlm.perf.memory.estimate import ADAM_STATE_BYTES
    from moe_vlm.perf.memory.megatron import grad_bytes

    spec, cfg = runtime_updated(recipes, engine_environment, *overrides)
    opt = cfg.optimizer
    assert opt.optimizer == "adam" and opt.use_distributed_optimizer
    state = [opt.main_params_dtype, opt.exp_avg_dtype, opt.exp_avg_sq_dtype]
    assert sum(dtype.itemsize for dtype in state) == ADAM_STATE_BYTES
    assert grad_bytes(spec)[0] == (4 if cfg.ddp.grad_reduce_in_fp32 else 2)
