"""Layout arithmetic rules (L...)."""

from __future__ import annotations

import math
from collections.abc import Iterator

from moe_vlm.config.schema import Arch, Engine
from moe_vlm.config.spec import RunSpec
from moe_vlm.rules.catalogue import (
    Level,
    Violation,
    rule,
)


@rule("L001", Level.error, "world divisible by TP x PP x CP")
def _world_tp_pp_cp(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    model_parallel = lay.tp * lay.pp * lay.cp
    if model_parallel > 0 and lay.world_size % model_parallel:
        yield Violation(
            ("nodes", "tp", "pp", "cp"),
            f"world size {lay.world_size} (nodes={lay.nodes} x {lay.ranks_per_node}/node) is not divisible "
            f"by TP x PP x CP = {model_parallel}.",
            "change nodes, or pick tp/pp/cp whose product divides the world size.",
        )


@rule("L002", Level.error, "world divisible by ETP x EP x PP")
def _world_etp_ep_pp(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    expert_parallel = lay.etp * lay.ep * lay.pp
    if expert_parallel > 0 and lay.world_size % expert_parallel:
        yield Violation(
            ("nodes", "ep", "etp", "pp"),
            f"world size {lay.world_size} is not divisible by ETP x EP x PP = {expert_parallel}.",
            "change nodes, or pick ep/etp/pp whose product divides the world size (ep=0 sizes EP for you).",
        )


@rule("L003", Level.error, "experts divisible by EP")
def _experts_ep(spec: RunSpec) -> Iterator[Violation]:
    ep = spec.layout.ep
    if ep > 0 and spec.model.num_experts % ep:
        yield Violation(
            ("ep",),
            f"{spec.model.name} has {spec.model.num_experts} experts, not divisible by EP={ep}.",
            "pick an EP that divides the expert count, or ep=0 to size it automatically.",
        )


@rule("L004", Level.error, "decoder layers split evenly over PP x VP stages")
def _layers_pp_vp(spec: RunSpec) -> Iterator[Violation]:
    lay, split = spec.layout, spec.pipeline
    first, last = split.first, split.last
    middle_stages, middle_layers = split.middle_stages, split.middle_layers
    if lay.pp < 1 or lay.vp < 1:
        return
    if not split.fits:
        yield Violation(
            ("parallelism.first_stage_layers", "parallelism.last_stage_layers", "pp"),
            f"first/last stage layers ({first}/{last}) do not fit {spec.model.num_layers} layers over PP={lay.pp}.",
            "lower first_stage_layers/last_stage_layers or raise pp.",
        )
        return
    if not split.even:
        # Megatron Core asserts it while building the stage (core/transformer/transformer_block.py:
        # 122-125, 148-150, 166-169); tests/megatron/test_recipes.py runs it on the H100 recipes.
        uneven = " (after the first/last stage layers)" if first or last else ""
        staged = (
            f"; the first/last stage's {first}/{last} over VP={lay.vp}"
            if (first or last) and lay.vp > 1
            else ""
        )
        yield Violation(
            ("pp", "vp"),
            f"{middle_layers} decoder layers{uneven} must split evenly over {middle_stages} stages x VP={lay.vp}"
            f"{staged}: Megatron Core asserts it when it builds the stages "
            "(megatron/core/transformer/transformer_block.py:122-125, 148-150, 166-169).",
            "pick pp/vp that divide the layer count, or set parallelism.first_stage_layers / "
            "last_stage_layers for an uneven split.",
        )


@rule("L005", Level.error, "TP divides the attention heads; query groups a multiple or divisor of TP (MLM)")
def _heads_tp(spec: RunSpec) -> Iterator[Violation]:
    # MCore splits the heads over TP ranks and, with fewer KV groups than ranks, replicates them
    # (TransformerConfig: num_query_groups must be a multiple or divisor of TP).
    tp = spec.layout.tp
    model = spec.model
    if tp < 1:
        return
    groups = model.num_query_groups
    if model.num_attention_heads % tp or (groups % tp and tp % groups):
        yield Violation(
            ("tp",),
            f"TP={tp} must divide the {model.num_attention_heads} attention heads of {model.name}, and its "
            f"{groups} query groups must be a multiple or a divisor of TP.",
            f"pick tp from the divisors of {math.gcd(model.num_attention_heads, groups)} or a multiple of "
            f"{groups} that divides {model.num_attention_heads}.",
        )


@rule("L006", Level.error, "GBS divisible by MBS x DP")
def _gbs(spec: RunSpec) -> Iterator[Violation]:
    step = spec.mbs * spec.layout.dp
    if step > 0 and spec.gbs % step:
        yield Violation(
            ("gbs", "mbs"),
            f"GBS={spec.gbs} is not a multiple of MBS x DP = {spec.mbs} x {spec.layout.dp} = {step}.",
            f"set gbs to a multiple of {step} (or gbs=null to round the model default).",
        )


@rule("L007", Level.error, "sequence length divisible by the CP/SP padding multiple (MB ConfigContainer)")
def _seq_cp(spec: RunSpec) -> Iterator[Violation]:
    # Bridge pads VLM batches to spec.collate_padding_multiple and rejects a seq_length that is not
    # a multiple of it (megatron/bridge/training/config.py:1213-1230).
    lay = spec.layout
    if lay.cp < 1 or lay.tp < 1:
        return
    multiple = spec.collate_padding_multiple
    if multiple > 1 and spec.seq_length % multiple:
        yield Violation(
            ("seq_length", "cp", "tp"),
            f"seq_length={spec.seq_length} must be a multiple of {multiple} "
            f"(2 x CP = {2 * lay.cp if lay.cp > 1 else 1}; TP x CP = {lay.tp * lay.cp} with sequence "
            "parallelism).",
            f"round seq_length to a multiple of {multiple}.",
        )


@rule("L008", Level.error, "virtual pipeline needs PP > 1")
def _vp_needs_pp(spec: RunSpec) -> Iterator[Violation]:
    if spec.layout.vp > 1 and spec.layout.pp <= 1:
        yield Violation(("vp", "pp"), "vp > 1 (interleaved pipeline) needs pp > 1.", "set vp=1 or raise pp.")


@rule("L009", Level.warning, "EP x TP wants sequence parallelism (MLM ModelParallelConfig warns)")
def _ep_tp_sp(spec: RunSpec) -> Iterator[Violation]:
    lay = spec.layout
    if lay.ep > 1 and lay.tp > 1 and not spec.parallelism.sequence_parallel and not _moe_tp_without_sp(spec):
        arch = spec.arch_profile
        yield Violation(
            ("parallelism.sequence_parallel", "tp", "ep"),
            "Megatron says sequence parallelism must be used when expert and tensor parallelism are combined"
            + (
                f" (the {arch.title} provider turns it on for TP > 1)."
                if arch.provider_forces_sp
                else " (it only warns)."
            ),
            "set parallelism.sequence_parallel=true.",
        )


@rule("L010", Level.error, "ETP must divide the expert FFN size")
def _etp_ffn(spec: RunSpec) -> Iterator[Violation]:
    etp = spec.layout.etp
    if etp > 1 and spec.model.moe_ffn_hidden_size % etp:
        yield Violation(
            ("etp",),
            f"ETP={etp} does not divide the expert FFN size {spec.model.moe_ffn_hidden_size}.",
            "pick etp from the divisors of the expert FFN size, or etp=1.",
        )


@rule("L011", Level.error, "one rank per GPU on GPU clusters")
def _ranks_per_gpu(spec: RunSpec) -> Iterator[Violation]:
    cluster = spec.cluster
    if cluster.is_gpu_cluster and spec.layout.ranks_per_node > cluster.gpus_per_node:
        yield Violation(
            ("nproc",),
            f"nproc={spec.layout.ranks_per_node} exceeds the {cluster.gpus_per_node} GPUs per node of {cluster.name}.",
            f"set nproc={cluster.gpus_per_node} (or null).",
        )


@rule("L012", Level.warning, "sequence parallelism without TP does nothing (MB TransformerConfig.finalize)")
def _sp_without_tp(spec: RunSpec) -> Iterator[Violation]:
    if spec.parallelism.sequence_parallel and spec.layout.tp == 1 and spec.engine is Engine.megatron:
        yield Violation(
            ("parallelism.sequence_parallel",),
            "sequence_parallel=true with TP=1 has no effect (Megatron Bridge turns it off).",
            "set parallelism.sequence_parallel=false or raise tp.",
        )


@rule("L013", Level.error, "Qwen3-VL deepstack layers sit on the first pipeline stage (MB Qwen3VLModel)")
def _deepstack_first_stage(spec: RunSpec) -> Iterator[Violation]:
    # Qwen3VLModel asserts, when it builds the first stage, that the first model chunk holds at
    # least as many decoder layers as there are deepstack feature levels
    # (megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py:359-362).
    lay, model = spec.layout, spec.model
    deepstack = len(model.vision_deepstack_layers)
    if spec.engine is not Engine.megatron or not spec.arch_profile.deepstack or not deepstack:
        return
    if lay.pp < 1 or lay.vp < 1 or not spec.pipeline.fits:  # L004 says why the split is broken
        return
    first_stage = spec.stage_layer_counts[0]
    first_chunk = first_stage // lay.vp
    if first_chunk < deepstack:
        yield Violation(
            ("parallelism.first_stage_layers", "pp", "vp"),
            f"the first pipeline chunk holds {first_chunk} decoder layer(s), fewer than the {deepstack} deepstack "
            f"levels {model.name} injects there: Qwen3VLModel asserts it at model build "
            "(megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py:360).",
            f"give the first stage at least {deepstack * lay.vp} layers (parallelism.first_stage_layers) or "
            "lower pp/vp.",
        )


@rule("L014", Level.error, "Qwen3-VL-MoE builds no interleaved pipeline stages (MB provider)")
def _vp_qwen3vl_moe(spec: RunSpec) -> Iterator[Violation]:
    # Qwen3VLMoEModelProvider.provide never passes vp_stage to Qwen3VLModel
    # (megatron/bridge/models/qwen_vl/qwen3_vl_provider.py:322-331), and with VP set Megatron Core
    # asserts "vp_stage must be provided" while building the layers
    # (megatron/core/transformer/transformer_layer.py:116-119, 189-192). The Qwen3.5 provider
    # passes it (qwen35_vl_provider.py:428-437).
    lay = spec.layout
    if spec.engine is Engine.megatron and spec.model.arch == Arch.qwen3_vl_moe and lay.pp > 1 and lay.vp > 1:
        yield Violation(
            ("vp",),
            f"vp={lay.vp}: Megatron Bridge's Qwen3-VL-MoE provider does not pass the virtual pipeline stage "
            f"to the model (qwen3_vl_provider.py:322-331), so building {spec.model.name} with VP > 1 fails at "
            "start-up: 'vp_stage must be provided' (megatron/core/transformer/transformer_layer.py:117-119).",
            "set vp=1 (more pp, or parallelism.first_stage_layers / last_stage_layers, balance the stages).",
        )


def _moe_tp_without_sp(spec: RunSpec) -> bool:
    return (
        spec.engine is Engine.megatron
        and spec.model.num_experts > 0
        and spec.layout.tp > 1
        and not spec.sequence_parallel
    )


@rule("L015", Level.error, "MoE layers with TP > 1 train only with sequence parallelism (MCore moe_layer.py)")
def _moe_tp_sp(spec: RunSpec) -> Iterator[Violation]:
    # MoELayer.forward raises in training when its attention TP group has more than one rank and
    # sequence parallelism is off (megatron/core/transformer/moe/moe_layer.py:629-633): at the first
    # MoE forward, not in TransformerConfig's checks. The Qwen3-VL-MoE provider turns SP on for TP > 1
    # (RunSpec.sequence_parallel); the Qwen3.5 one leaves the knob as it is.
    if _moe_tp_without_sp(spec):
        yield Violation(
            ("parallelism.sequence_parallel", "tp"),
            f"tp={spec.layout.tp} without sequence parallelism: {spec.model.name}'s MoE layers refuse to train "
            "with TP > 1 and sequence parallelism off, at the first forward ('performance may degrade if MoE and "
            "tensor parallelism are enabled without also enabling sequence parallelism', "
            "megatron/core/transformer/moe/moe_layer.py:629-633).",
            "set parallelism.sequence_parallel=true, or tp=1.",
        )
