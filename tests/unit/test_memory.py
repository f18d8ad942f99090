"""The memory estimate, term by term, against figures worked out by hand (arithmetic in comments),
against the real transformers model (parameter counts, autograd's saved tensors), and the
memory rules and dry-run section built on it."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
import transformers
from PIL import Image
from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

from moe_vlm.perf.memory import (
    GIB,
    GPU_FRAGMENTATION_FRACTION,
    GPU_FRAMEWORK_CONSTANT_GIB,
    PIXEL_VALUE_COPIES,
    SELECTIVE_DEFAULT,
    estimate,
    image_budget,
    megatron_stage,
    param_counts,
    patches_for_image,
    torch_decoder_bytes,
    torch_vision_bytes,
    training_of,
    with_recompute,
)
from moe_vlm.rules import validate
from moe_vlm.run.plan import render
from tests.conftest import make_spec

# 30B on 2 B200 nodes, 3D: TP2 (sequence parallel) PP2 EP4 -> DP = 16/(2x2) = 4, expert DP = 16/(4x1x2) = 2.
THREE_D = [
    "cluster=b200",
    "model=qwen3_vl_30b_a3b",
    "nodes=2",
    "parallelism=3d",
    "tp=2",
    "pp=2",
    "ep=4",
    "parallelism.sequence_parallel=true",
    "data=mock",
    "seq_length=4096",
]
# Qwen3-VL-30B-A3B, by hand:
#   attention  = q 2048x4096 + k,v 2x2048x512 + o 4096x2048 + q/k norms 2x128 = 18,874,624
#   dense/layer = attention + 2 norms x 2048 + router 128x2048               = 19,140,864
#   experts/layer = 128 x 3 x 2048 x 768                                        = 603,979,776
#   embedding = lm_head = 151936 x 2048                                         = 311,164,928
#   vision = patch 1536x1152 + 1152 + pos 2304x1152 + 27 blocks x 15,239,504    = 415,891,440
#     (block = 4x1152 + 3x1152^2 + 3x1152 + 1152^2 + 1152 + 2x1152x4304 + 4304 + 1152)
#   projector = (2x1152 + 30,677,504) + 3 deepstack x (2x4608 + 30,677,504)    = 122,739,968
#     (merger MLP = 4608^2 + 4608 + 4608x2048 + 2048 = 30,677,504)
DENSE_LAYER, EXPERT_LAYER, EMBEDDING = 19_140_864, 603_979_776, 311_164_928
VISION, PROJECTOR = 415_891_440, 122_739_968
# Of DENSE_LAYER, what each TP rank holds whole: norms 2h, q/k norms 2d, router e x h (Megatron Core
# marks none of them tensor_model_parallel: tests/megatron/test_param_counts.py).
REPLICATED_LAYER = 2 * 2048 + 2 * 128 + 128 * 2048  # 266,496
SPLIT_LAYER = DENSE_LAYER - REPLICATED_LAYER
# Of VISION + PROJECTOR, held whole likewise: patch embedding 3x2x16^2x1152 + 1152, position
# embedding 2304x1152, per block 2 LayerNorms + 2 row-parallel biases (6 x 1152); mergers' norms and
# fc2 biases (2x1152 + 2048, 3 x (2x4608 + 2048)).
REPLICATED_VISION = 4_611_456 + 38_144
SPLIT_FIRST = 24 * SPLIT_LAYER + EMBEDDING + VISION + PROJECTOR - REPLICATED_VISION


def stage_terms(overrides: list[str], stage: int) -> dict[str, float]:
    spec = make_spec(*overrides)
    found = megatron_stage(spec, stage, image_budget(spec), param_counts(spec.model))
    return {t.name: t.bytes for t in found.terms}


@pytest.mark.parametrize(
    "name", ["tiny_moe_vlm", "qwen3_vl_30b_a3b", "qwen3_vl_235b_a22b", "qwen35_vl_35b_a3b"]
)
def test_parameter_counts_match_transformers(name: str) -> None:
    from moe_vlm.engines.hf_config import transformers_config

    model = make_spec(f"model={name}").model
    config = transformers_config(model)
    with torch.device("meta"):
        built = getattr(transformers, config.architectures[0])(config)
    counts = param_counts(model)
    assert counts.total == sum(p.numel() for p in built.parameters())
    visual = sum(p.numel() for n, p in built.named_parameters() if ".visual." in n or n.startswith("visual."))
    assert counts.vision + counts.projector == visual


def test_hand_counted_30b_parts() -> None:
    counts = param_counts(make_spec("model=qwen3_vl_30b_a3b").model)
    assert (counts.layers[0].dense, counts.layers[0].experts) == (DENSE_LAYER, EXPERT_LAYER)
    assert (counts.embedding, counts.lm_head, counts.vision, counts.projector) == (
        EMBEDDING,
        EMBEDDING,
        VISION,
        PROJECTOR,
    )


def test_3d_parameters_gradients_optimizer_first_stage() -> None:
    terms = stage_terms(THREE_D, 0)
    # First stage: 24 layers + embedding + vision + projector, dense / TP2 (but for the replicated
    # norms and router); experts / (EP4 x ETP1).
    dense = SPLIT_FIRST / 2 + 24 * REPLICATED_LAYER + REPLICATED_VISION  # 660,111,288
    experts = 24 * EXPERT_LAYER / 4  # 3,623,878,656
    assert terms["parameters"] == 2 * (dense + experts)  # bf16: 8,567,979,888 B
    # Main grads in the parameters' bf16: the perf recipes' grad_reduce_in_fp32=false (param_and_grad_buffer.py:917).
    assert terms["gradients"] == 2 * (dense + experts)  # 8,567,979,888 B
    fp32 = stage_terms([*THREE_D, "overlap.grad_reduce_in_fp32=true"], 0)
    assert fp32["gradients"] == 4 * (dense + experts)  # fp32 main grads: 17,135,959,776 B
    # Distributed optimizer: 12 B/param over DP x CP = 4 (dense) and expert DP = 2 (experts).
    assert terms["optimizer_state"] == 12 * (dense / 4 + experts / 2)  # 23,723,605,800 B


def test_3d_last_stage_holds_the_output_layer_and_logits() -> None:
    terms = stage_terms(THREE_D, 1)
    dense = (24 * SPLIT_LAYER + EMBEDDING) / 2 + 24 * REPLICATED_LAYER + 2048  # lm_head; final norm whole
    assert terms["parameters"] == 2 * (dense + 24 * EXPERT_LAYER / 4)
    # The perf recipes' TE cross entropy: 4096 tokens x 151936 vocab / TP2 x (2 B bf16 logits + the
    # 2 B bf16 copy it keeps) = 1,244,659,712 B; Megatron's own keeps an fp32 softmax (2 + 4 B).
    assert terms["logits"] == 4096 * 151936 / 2 * 4
    for impl in ("native", "off"):
        assert stage_terms([*THREE_D, f"fusion.cross_entropy={impl}"], 1)["logits"] == 4096 * 151936 / 2 * 6
    assert "vision_activations" not in terms and "pipeline_in_flight" not in terms


def test_decoder_activations_per_token_by_hand() -> None:
    terms = stage_terms(THREE_D, 0)
    h, a, g, d, e, k, f = 2048, 32, 4, 128, 128, 8, 768
    # Token-sharded under SP (/TP2): both norms' input + rsigma + output, router probs + map.
    sp = (4 * 2 * h + 2 * 4 + 5 * e) / 2  # 8,516
    # Head-split (/TP2): q,k,v + q/k-norm inputs + attention output + fp32 log-sum-exp.
    tp = (2 * (a * d + 2 * g * d) + 2 * (a * d + g * d) + 2 * a * d + 4 * a) / 2  # 13,888
    # Experts: fc1 input 2hk (x ETP1), fc1 output 2x2fk, SwiGLU output 2fk; the combine keeps nothing
    # (the probs are applied in the activation: tests/megatron/test_vendor_memory.py).
    experts = 2 * h * k + 4 * f * k + 2 * f * k  # 69,632
    per_token_layer = sp + tp + experts  # 92,036 B
    assert terms["decoder_activations"] == 24 * 4096 * per_token_layer
    # 1F1B, PP2, 128 micro-batches: the first stage holds 2 micro-batches, one more than counted.
    assert terms["pipeline_in_flight"] == terms["decoder_activations"]


def test_memory_reads_sequence_parallelism_as_the_engine_runs_it() -> None:
    """Bridge's Qwen3-VL-MoE provider runs SP whenever TP > 1, so the knob must not change the estimate.

    It did: sequence_parallel=false gave decoder_activations 24.41 GiB (total 129.49), true 22.85
    (127.85). With SP a layer keeps 92,036 B per token (test_decoder_activations_per_token_by_hand; 124,804
    before the combine's expert output was dropped), whatever the knob says.
    """
    base = ["cluster=b200", "parallelism=3d", "model=qwen3_vl_30b_a3b", "tp=2"]
    off = estimate(make_spec(*base, "parallelism.sequence_parallel=false"))
    on = estimate(make_spec(*base, "parallelism.sequence_parallel=true"))
    assert off.to_dict() == on.to_dict()
    decoder = on.term("decoder_activations")
    assert decoder is not None and decoder.bytes == 48 * 4096 * 92_036
    # Where no provider forces it, the knob still decides.
    q35 = ["cluster=b200", "parallelism=3d", "model=qwen35_vl_35b_a3b", "tp=2"]
    q35_off = estimate(make_spec(*q35)).gib_of("decoder_activations")
    assert q35_off > estimate(make_spec(*q35, "parallelism.sequence_parallel=true")).gib_of(
        "decoder_activations"
    )


def test_framework_overhead_is_constant_plus_fragmentation() -> None:
    terms = stage_terms(THREE_D, 0)
    allocated = sum(
        v for name, v in terms.items() if name not in ("dispatcher_buffers", "framework_overhead")
    )
    assert terms["framework_overhead"] == pytest.approx(
        GPU_FRAMEWORK_CONSTANT_GIB * GIB + GPU_FRAGMENTATION_FRACTION * allocated
    )


def test_frozen_modules_hold_no_gradients_or_optimizer_state() -> None:
    base = stage_terms(THREE_D, 0)
    frozen = stage_terms([*THREE_D, "vision_freeze=vision_projector"], 0)
    assert frozen["parameters"] == base["parameters"]  # frozen weights are still there
    # The vision side on a TP2 rank: its split part halved, its replicated part whole.
    vision_rank = (VISION + PROJECTOR - REPLICATED_VISION) / 2 + REPLICATED_VISION
    assert base["gradients"] - frozen["gradients"] == 2 * vision_rank  # bf16 main grads
    assert base["optimizer_state"] - frozen["optimizer_state"] == pytest.approx(12 * vision_rank / 4)
    frozen_lm = stage_terms([*THREE_D, "vision_freeze.language=true"], 0)
    assert frozen_lm["gradients"] == 2 * vision_rank  # only the vision side trains
    # Mock data: no images reach the trainable vision side, so the frozen decoder keeps nothing.
    assert frozen_lm["decoder_activations"] == 0


def test_experts_divide_by_ep_times_etp() -> None:
    base = ["cluster=b200", "model=qwen3_vl_30b_a3b", "nodes=2", "parallelism=3d", "data=mock"]
    ep8 = stage_terms([*base, "ep=8"], 0)
    ep4_etp2 = stage_terms([*base, "ep=4", "etp=2"], 0)
    ep16 = stage_terms([*base, "ep=16"], 0)
    dense = 48 * DENSE_LAYER + EMBEDDING + 2048 + EMBEDDING + VISION + PROJECTOR
    assert ep8["parameters"] == ep4_etp2["parameters"] == 2 * (dense + 48 * EXPERT_LAYER / 8)
    assert ep16["parameters"] == 2 * (dense + 48 * EXPERT_LAYER / 16)
    # ETP is not free: each ETP rank receives its whole group's tokens (fc1 input x ETP).
    extra = 48 * 4096 * (2 * 2048 * 8 * 2 - 2 * 2048 * 8)
    assert ep4_etp2["decoder_activations"] - ep8["decoder_activations"] == extra


@pytest.mark.parametrize("engine", ["megatron", "torch"])
def test_recompute_modes_order(engine: str) -> None:
    base = (
        ["cluster=b200", "model=qwen3_vl_30b_a3b", "nodes=1", "data=mock"]
        if engine == "megatron"
        else ["data=mock", "seq_length=512", "mbs=2", "model.num_layers=8"]  # full pays off past a few layers
    )
    value = {
        mode: estimate(make_spec(*base, *extra)).gib_of("decoder_activations")
        for mode, extra in {
            "none": [],
            "selective": ["recompute=selective"],
            "selective_moe": ["recompute=selective", "recompute.modules=[core_attn,layernorm,moe]"],
            "full": ["recompute=full"],
        }.items()
    }
    assert value["none"] >= value["selective"] > value["selective_moe"] > value["full"] > 0


def test_full_recompute_keeps_layer_inputs_and_one_layer() -> None:
    spec = make_spec("cluster=b200", "model=qwen3_vl_30b_a3b", "nodes=1", "data=mock", "recompute=full")
    none = make_spec("cluster=b200", "model=qwen3_vl_30b_a3b", "nodes=1", "data=mock")
    full = estimate(spec).term("decoder_activations")
    one_layer = estimate(none).term("decoder_activations")
    assert full is not None and one_layer is not None
    # 48 layer inputs of 2h bytes x 4096 tokens + one layer rematerialised (1/48 of no recompute).
    assert full.bytes == pytest.approx(48 * 2 * 2048 * 4096 + one_layer.bytes / 48)


def test_pipeline_in_flight_micro_batches() -> None:
    big = ["cluster=b200", "model=qwen3_vl_235b_a22b", "nodes=8", "parallelism=3d", "pp=8", "data=mock"]
    split = ["parallelism.first_stage_layers=11", "parallelism.last_stage_layers=11"]
    assert make_spec(*big, *split).in_flight_micro_batches == 8  # 1F1B: PP micro-batches
    # Interleaved: x (1 + (PP-1)/(PP x VP)) = 8 x (1 + 7/16) = 11.5 (Megatron theoretical_memory_usage)
    assert make_spec(*big, *split, "vp=2").in_flight_micro_batches == 11.5
    # GBS 32 = MBS 1 x DP 8 x 4 micro-batches: only 4 can be in flight.
    assert make_spec(*big, *split, "gbs=32").in_flight_micro_batches == 4


def test_deepep_buffer_by_hand() -> None:
    spec = make_spec("cluster=b200", "model=qwen3_vl_30b_a3b", "nodes=1", "dispatcher=deepep")
    term = estimate(spec).term("dispatcher_buffers")
    assert term is not None and not term.allocator
    # 20 SMs -> 10 channels x 8 NVLink ranks x 256 recv tokens x (2x2048 hidden + 128x8 top-k idx
    # + 128x4 weights + 128x4 scales + 8 meta = 6,152 B) = 125,992,960 B; no RDMA inside 8 ranks.
    assert term.bytes == 10 * 8 * 256 * 6152


def test_hybridep_buffer_by_hand() -> None:
    spec = make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "dispatcher=hybridep")
    term = estimate(spec).term("dispatcher_buffers")
    assert term is not None and spec.layout.ep == 8
    # Worst case 4096 tokens/rank x 8 ranks = 32,768 tokens: 2 bf16 token buffers x 2048 hidden,
    # 2 fp32 prob buffers x 128 experts, fp32 scales x 2048/128.
    assert term.bytes == 2 * 32768 * 2048 * 2 + 2 * 32768 * 128 * 4 + 32768 * 16 * 4  # 304,087,040
    assert (
        estimate(
            make_spec("cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "dispatcher=alltoall")
        ).gib_of("dispatcher_buffers")
        == 0
    )


def test_cuda_graph_pool_by_hand() -> None:
    base = ["cluster=b200", "model=qwen3_vl_30b_a3b", "nodes=1", "data=mock", "recompute=selective"]
    term = estimate(make_spec(*base, "cuda_graph=te_moe")).term("cuda_graph_pool")
    assert term is not None
    # moe_router: bf16 input 2x2048 + fp32 probs and bool map 5x128; moe_preprocess: 8x8 indices.
    per_token = 2 * 2048 + 5 * 128 + 8 * 8  # 4,800 B
    assert term.bytes == per_token * 4096 * 48 + 0.5 * GIB
    assert estimate(make_spec(*base)).gib_of("cuda_graph_pool") == 0


def test_image_budget_follows_the_data_kind() -> None:
    assert image_budget(make_spec("data=mock")).patches == 0
    spec = make_spec("data=synthetic", "model=qwen3_vl_30b_a3b", "seq_length=8192", "mbs=2")
    budget = image_budget(spec)
    # Largest default image: 1344 x 1008 (aspect 0.75) -> 1152 x 864 px at max_pixels -> 72 x 54 patches.
    assert budget.max_patches_per_image == 3888
    assert budget.patches == 2 * 2 * 3888  # MBS 2 x 2 images
    # A row never holds more image tokens than seq_length: 4 patches per token.
    assert image_budget(make_spec("data=synthetic", "seq_length=1024")).patches == 4 * 1023
    real = make_spec("data=real", "data.path=/nonexistent/moe_vlm", "model=qwen3_vl_30b_a3b")
    assert image_budget(real).max_patches_per_image == 1003520 // 256  # max_pixels / 16^2


@pytest.mark.parametrize("hw", [(1344, 1008), (336, 500), (64, 64), (3000, 200), (1080, 1920)])
def test_patches_match_the_qwen_image_processor(hw: tuple[int, int]) -> None:
    spec = make_spec("data=synthetic")
    h_bar, w_bar = smart_resize(
        *hw, factor=32, min_pixels=spec.data.min_pixels, max_pixels=spec.data.max_pixels
    )
    assert patches_for_image(spec, *hw) == (h_bar // 16) * (w_bar // 16)


def test_real_data_budget_reads_image_headers(tmp_path) -> None:
    from moe_vlm.data.energon import CaptionedImage, write_dataset

    def jpeg(width: int, height: int) -> bytes:
        buffer = io.BytesIO()
        Image.new("RGB", (width, height), (120, 30, 200)).save(buffer, format="JPEG")
        return buffer.getvalue()

    samples = [
        CaptionedImage(f"s{i}", jpeg(w, h), "a photo") for i, (w, h) in enumerate([(320, 240), (640, 480)])
    ]
    write_dataset(tmp_path / "ds", samples, samples_per_shard=8)
    spec = make_spec("data=real", f"data.path={tmp_path / 'ds'}", "mbs=2")
    budget = image_budget(spec)
    assert budget.max_patches_per_image == 40 * 30  # 640 x 480 -> 640 x 480 px (multiples of 32)
    assert budget.patches == 2 * 1200 and "2 image headers" in budget.source


def autograd_saved_bytes(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> int:
    """Bytes of every distinct storage autograd keeps for backward, parameters and their views excluded."""
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(**inputs)
    return sum(kept.values())


@pytest.mark.parametrize(
    "overrides",
    [
        ["data=mock", "seq_length=256", "mbs=2"],
        [
            "data=synthetic",
            "data.max_long_side_px=224",
            "data.min_long_side_px=160",
            "seq_length=512",
            "mbs=2",
        ],
        [
            "data=synthetic",
            "data.min_long_side_px=160",
            "data.max_long_side_px=224",
            "seq_length=512",
            "vision_freeze=vision",
        ],
        [
            "data=synthetic",
            "data.min_long_side_px=160",
            "data.max_long_side_px=224",
            "seq_length=512",
            "vision_freeze=vision_projector",
        ],
    ],
)
def test_torch_activation_count_matches_autograd(overrides: list[str]) -> None:
    from moe_vlm.data import build_batches
    from moe_vlm.engines.torch_model import apply_freeze, apply_recompute, build_model

    spec = make_spec(*overrides)
    model = build_model(spec.model, spec.recompute, torch.device("cpu"), spec.seed)
    apply_freeze(model, spec.freeze)
    apply_recompute(model, spec.recompute)
    batch = next(build_batches(spec, 0, 1))
    measured = autograd_saved_bytes(model, batch.model_inputs())
    patches = batch.stats.vision_patches
    training = dataclasses.replace(training_of(spec, image_budget(spec)), images=patches > 0)
    padded = bool((batch.attention_mask == 0).any())  # a full row runs causal SDPA without a mask
    decoder, _, _ = torch_decoder_bytes(spec, training, 4, padded)
    vision, _, pixels = torch_vision_bytes(spec, training, patches, 4)
    # The patch embedding keeps pixel_values (one of the copies held) for its weight gradient only
    # when the ViT trains.
    predicted = decoder + vision + (pixels / PIXEL_VALUE_COPIES if training.vision and patches else 0)
    assert predicted == pytest.approx(measured, rel=0.02)


def test_memory_rules_fire_by_margin_and_suggest_a_fitting_change() -> None:
    big = [
        "cluster=gb200", "model=qwen3_vl_235b_a22b", "nodes=16", "dispatcher=hybridep", "data=synthetic",
        "seq_length=5376",
    ]  # fmt: skip
    over = estimate(make_spec(*big))
    assert over.capacity_gib == 185.0 and 1.0 < over.total_gib / 185.0 <= 1.10  # about 192 GiB
    findings = {f.code: f for f in validate(make_spec(*big))}
    assert "M001" not in findings and not findings["M003"].is_error  # within the 10% uncertainty
    m001 = {f.code: f for f in validate(make_spec(*big, "mbs=2"))}["M001"]
    assert m001.is_error and "GiB per GPU > GPU memory 185.0 GiB" in m001.message
    assert "recompute=" in m001.fix and "predicted" in m001.fix
    assert not {"M001", "M002", "M003"} & {f.code for f in validate(make_spec(*big, "recompute=full"))}


def test_full_recompute_warning_depends_on_selective_fitting() -> None:
    small = ["cluster=b200", "model=qwen3_vl_30b_a3b", "nodes=1", "recompute=full"]
    big = [
        "cluster=gb200", "model=qwen3_vl_235b_a22b", "nodes=16", "dispatcher=hybridep", "recompute=full",
        "seq_length=5376",
    ]  # fmt: skip
    assert estimate(with_recompute(make_spec(*small), SELECTIVE_DEFAULT)).fits
    assert "R003" in {f.code for f in validate(make_spec(*small))}
    assert not estimate(with_recompute(make_spec(*big, "data=synthetic"), SELECTIVE_DEFAULT)).fits
    assert "R003" not in {f.code for f in validate(make_spec(*big, "data=synthetic"))}


def test_dry_run_plan_prints_breakdown_and_headroom() -> None:
    spec = make_spec(
        "cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2", "dispatcher=hybridep", "dry_run=true"
    )
    text = render(spec, validate(spec))
    section = text.split("-- memory per GPU")[1].split("\n\n")[0]
    for name in ("parameters", "gradients", "optimizer_state", "decoder_activations", "vision_activations"):
        assert name in section
    assert "of 185.0 GiB GPU memory: headroom" in section and "FITS" in section
    cpu = render(make_spec("dry_run=true"), [])
    assert "runtime_baseline" in cpu and "process_peak_rss" in cpu


# A 30B decoder layer's Transformer Engine GEMM weights: the attention projections, 18,874,624 - 256
# (q/k norms) = q 2048x4096 + k,v 2x2048x512 + o 4096x2048 = 18,874,368; norms and the router stay bf16.
ATTENTION_GEMM = 18_874_368


@pytest.mark.parametrize(
    ("cluster", "precision", "per_weight"),
    [
        ("b200", "fp8cs", 1.0),  # Blackwell: one FP8 buffer serves both GEMM layouts
        ("h100", "fp8cs", 2.0),  # Hopper: + its transpose
        ("b200", "fp8mx", 2.0625),  # row- and column-wise: 2 x (1 B + one E8M0 byte per 32)
        ("b200", "nvfp4", 1.125),  # row- and column-wise: 2 x (1/2 B + one E4M3 byte per 16)
    ],
)
def test_quantized_gemm_weights_replace_their_bf16_share(
    cluster: str, precision: str, per_weight: float
) -> None:
    overrides = [*THREE_D, f"cluster={cluster}"]
    bf16, quantized = stage_terms(overrides, 0), stage_terms([*overrides, f"precision={precision}"], 0)
    # First stage of THREE_D: 24 layers; dense parts / TP2, experts / (EP4 x ETP1).
    dense = SPLIT_FIRST / 2 + 24 * REPLICATED_LAYER + REPLICATED_VISION
    gemm, experts = 24 * ATTENTION_GEMM / 2, 24 * EXPERT_LAYER / 4
    assert bf16["parameters"] == 2 * (dense + experts) and "quantized_weights" not in bf16
    assert quantized["parameters"] == 2 * (dense - gemm)  # vision, embedding, norms, router: bf16
    assert quantized["quantized_weights"] == per_weight * (gemm + experts)
    # FP32 main gradients and Adam state do not change with the compute format.
    assert quantized["gradients"] == bf16["gradients"]
    assert quantized["optimizer_state"] == bf16["optimizer_state"]
