"""One step's seconds on one GPU (or CPU rank): the slowest pipeline stage's micro-batches (step.py's
StepModel prices each), the pipeline's bubble, the exchange left exposed after the overlap the
knobs turn on, the host's launches, and what the step does once: the data-parallel exchange, the
optimizer, the data loader's host time. ``loads`` is what model.py, runs.py and published.py
read; ``not_modelled`` what the plan lists as not represented.
"""

from __future__ import annotations

from collections.abc import Iterable

from moe_vlm.config.arch import Mixer, Mlp, layer_kinds
from moe_vlm.config.schema import (
    Engine,
    ModelConfig,
    ParallelismFamily,
    RecomputeGranularity,
    ShardingStrategy,
    TokenDispatcher,
)
from moe_vlm.config.spec import RunSpec
from moe_vlm.data.workers import data_workers
from moe_vlm.perf.flops import Workload
from moe_vlm.perf.memory.megatron import grad_bytes
from moe_vlm.predict import kernels as k
from moe_vlm.predict.hardware import Hardware
from moe_vlm.predict.step import (
    BF16_BYTES,
    FP32_BYTES,
    TORCH_OPS,
    StepModel,
    Tally,
    full_graph,
    param_counts_of,
    param_split,
)
from moe_vlm.predict.terms import Load, Term
from moe_vlm.predict.workload import SampleSpread, expected_workload

# Adam with fp32 main weights, per trainable parameter: read param, grad, m, v (4 x 4 B), write
# param, m, v (3 x 4 B) and the bf16 model copy (2 B) (megatron/core/optimizer/distrib_optimizer.py).
ADAM_BYTES_PER_PARAM = 4 * 4 + 3 * 4 + 2
# On the host (MCore's HybridDeviceOptimizer steps offloaded parameters with torch.optim.AdamW,
# megatron/core/optimizer/__init__.py:11, 512), torch runs AdamW one tensor at a time on CPU tensors
# (torch/optim/adam.py _single_tensor_adam): the weight decay, lerp_, mul_ + addcmul_, sqrt, the
# divide, add_(eps) and addcdiv_ each stream whole fp32 tensors: 12 reads and 8 writes per parameter.
HOST_ADAM_BYTES_PER_PARAM = (12 + 8) * 4


# Selective recompute on the torch engine re-runs one module of a layer (its core attention, norms
# or MoE block): about a fifth of the layer's eager ops (test_predict_kernels.py counts 112 a layer).
SELECTIVE_OPS_SHARE = 0.2

NOT_MODELLED = (
    "cuda_graph.warmup_steps: capture happens in warm-up, outside the steady window",
    "HSDP (parallelism.dp_outer): no published rate for Megatron FSDP's outer replicas; their all-reduce "
    "is priced as the inner DP's",
    "CP's KV exchange (cp > 1): no published rate for the ring attention's overlap",
    "offload.activation_layers: TE's activation offload overlaps its copies with compute at a share "
    "no source measures (sister-skills.md 2.5 gives only the optimizer's)",
    "gc (manual / auto): Python garbage-collection pauses depend on the host's heap, which no source measures",
    "fusion knobs (moe_permute_fusion, moe_router_fusion, cross_entropy, bias_activation_fusion): no "
    "published per-kernel A/B; their kernels are in the fixed counts",
    "dispatcher.num_sms and HybridEP chunking: published rates exist at 16-48 SMs but not their cost to "
    "the overlapped GEMMs; the EP kernels run at their recipes' default-SM rate",
)


def _counts(kinds: Iterable[tuple[Mixer, Mlp]]) -> dict[tuple[Mixer, Mlp], int]:
    out: dict[tuple[Mixer, Mlp], int] = {}
    for kind in kinds:
        out[kind] = out.get(kind, 0) + 1
    return out


def loads(spec: RunSpec, workload: Workload, hw: Hardware, spread: SampleSpread | None = None) -> list[Load]:
    """Every nonzero term of one step on one GPU (or CPU rank) at the hardware's rates; `spread`:
    the samples' image-work spread (default: the data distribution's, workload.expected_workload)."""
    model = StepModel(spec, workload, hw, spread if spread is not None else expected_workload(spec).spread)
    lay = spec.layout
    m = model.micro_batches
    kinds = layer_kinds(spec.model)
    costs = {pair: model.layer(*pair) for pair in {(kind.mixer, kind.mlp) for kind in kinds}}
    recompute = model.recomputed_share()
    vision = model.vision()

    # Per pipeline stage, one micro-batch: its layers, the vision tower on the first, the logits on the last.
    logits = model.logits()
    stages: list[tuple[Tally, Tally, float, float]] = []
    for stage in range(max(lay.pp, 1)):
        device, comm, host, kernels_ = Tally(), Tally(), 0.0, 0.0
        indices = spec.stage_layer_indices(stage) if lay.pp > 1 else range(spec.model.num_layers)
        for kind, count in _counts((kinds[i].mixer, kinds[i].mlp) for i in indices).items():
            cost = costs[kind]
            device.merge(cost.device.scaled(count))
            comm.merge(cost.comm.scaled(count))
            host += cost.host * count
            kernels_ += cost.kernels * count
            redo = model.forward_of(cost)
            for term, seconds in redo.seconds.items():
                device.add(term, seconds * recompute.get(term.value, 0.0) * count)
            if recompute and model.torch:  # the recomputed modules' forward ops run again
                full = spec.recompute.granularity is RecomputeGranularity.full
                share = recompute.get("dense", 0.0) if full else SELECTIVE_OPS_SHARE
                host += cost.host / 2 * count * share
        if stage == 0:
            device.merge(vision.seconds)
            device.merge(model.imbalance(vision))
            kernels_ += vision.kernels
            if model.torch:
                host += model.ops(vision.kernels + TORCH_OPS["glue"] * (1 + model.passes.decoder_grad))
        if stage == lay.pp - 1:
            device.merge(logits)
        stages.append((device, comm, host, kernels_))

    # The slowest stage sets the pace; its device time, its exposed exchange, its host time.
    def stage_seconds(entry: tuple[Tally, Tally, float, float]) -> float:
        device, comm, host, kernels_ = entry
        return device.total + exposed(model, device, comm).total + _host(model, device, host, kernels_)

    slowest = max(stages, key=stage_seconds)
    device, comm, host, kernels_ = slowest
    per_mb = Tally()
    per_mb.merge(device)
    per_mb.merge(exposed(model, device, comm))
    host_s = _host(model, device, host, kernels_)
    out = per_mb.scaled(m)
    if host_s > 0:
        what = "eager ops" if hw.synchronous else "launches the device waits for"
        out.add(Term.launch, host_s * m, f"{what} at {hw.launch_s * 1e6:.3g} us each, {m} micro-batch(es)")
    for term, why in device.why.items():
        out.why.setdefault(term, why)
    if lay.pp > 1:
        stage_mb = stage_seconds(slowest)
        bubble = (lay.pp - 1) / max(lay.vp, 1) * stage_mb
        p2p = 0.0
        if lay.vp <= 1:  # overlap_p2p_comm is on only with VP (sister-skills C16)
            size = model.mb.tokens * spec.model.hidden_size * BF16_BYTES / model.sp_tp
            # Stages are a node's worth of ranks apart at least: the send leaves the node.
            p2p = 2 * m * model.link_for(lay.ranks_per_node + 1).seconds(size)
        out.add(
            Term.pipeline,
            bubble + p2p,
            f"bubble (PP-1)/VP = {(lay.pp - 1) / max(lay.vp, 1):.3g} stage-times of {stage_mb * 1e3:,.1f} ms, "
            f"{m} micro-batches; slowest stage of {lay.pp}",
        )
    out.merge(_data_parallel(model, out))
    out.merge(_optimizer(model))
    out.merge(_data(model, out.total))
    return [
        Load(term, seconds, out.why.get(term, "")) for term, seconds in out.seconds.items() if seconds > 0
    ]


def exposed(model: StepModel, device: Tally, comm: Tally) -> Tally:
    """The EP exchange and TP collectives of one stage and micro-batch left exposed: EP overlap
    (MCore's combined 1F1B) runs one micro-batch's dispatch and combine under another's compute, so
    all but the first forward's and last backward's can hide, up to the compute there is."""
    out = Tally()
    spec = model.spec
    overlap = spec.dispatcher.overlap_moe_expert_parallel_comm and model.micro_batches > 1
    compute = (
        device.seconds.get(Term.experts, 0.0)
        + device.seconds.get(Term.attention, 0.0)
        + device.seconds.get(Term.dense, 0.0)
    )
    for term, seconds in comm.seconds.items():
        why = comm.why.get(term, "")
        if term is Term.tp:
            if spec.tp_comm_overlap:
                hidden = min(
                    seconds, device.seconds.get(Term.dense, 0.0) + device.seconds.get(Term.experts, 0.0)
                )
                out.add(term, seconds - hidden, f"{why}; userbuffers overlap hides {hidden / seconds:.0%}")
            else:
                out.add(term, seconds, why)
            continue
        if overlap:
            hidden = min(seconds, compute) * (model.micro_batches - 1) / model.micro_batches
            out.add(term, seconds - hidden, f"{why}; EP overlap hides {hidden / seconds:.0%}")
        else:
            out.add(term, seconds, f"{why}; not overlapped")
    return out


def _host(model: StepModel, device: Tally, host: float, kernels_: float) -> float:
    """Host seconds per micro-batch the device waits for. CPU: every op (the host is the device).
    GPU: the launches after each MoE sync, and any excess of all launches over the device time
    (a layer too small to cover its own launches); full-iteration graphs launch once."""
    if model.hw.synchronous:
        return host
    if full_graph(model.spec):
        return 0.0
    launches = model.ops(kernels_)
    return host + max(0.0, launches - device.total)


def _data_parallel(model: StepModel, step: Tally) -> Tally:
    """FSDP's or the distributed optimizer's traffic per step, less what its overlap hides."""
    out = Tally()
    spec, lay, hw = model.spec, model.lay, model.hw
    params = param_counts_of(spec.model)
    frozen = (params.vision if spec.freeze.vision else 0) + (params.projector if spec.freeze.projector else 0)
    dense_local, experts_local = param_split(spec)
    frozen_local = frozen / max(lay.tp * lay.pp, 1)
    width = FP32_BYTES if model.torch and hw.synchronous else BF16_BYTES
    gbytes = grad_bytes(spec)[0] if spec.engine is Engine.megatron else width
    dense_n, expert_n = max(lay.dp * lay.cp, 1), max(lay.expert_dp, 1)
    dense_link = model.link_for(dense_n * lay.tp * lay.cp)
    expert_link = model.link_for(expert_n * lay.ep * lay.etp)
    m = model.micro_batches

    gather = k.ring_s(dense_link, dense_local * width, dense_n) + k.ring_s(
        expert_link, experts_local * width, expert_n
    )
    reduce = k.ring_s(dense_link, (dense_local - frozen_local) * gbytes, dense_n) + k.ring_s(
        expert_link, experts_local * gbytes, expert_n
    )
    if gather + reduce <= 0:
        return out
    compute = sum(step.seconds.get(t, 0.0) for t in Term if t.is_compute) / m
    strategy = spec.parallelism.sharding_strategy
    if spec.family is ParallelismFamily.fsdp:
        reshard = strategy is ShardingStrategy.optim_grads_params
        per_mb = gather * (2 if reshard else 0) + reduce
        once = 0.0 if reshard else gather
        if model.torch and hw.synchronous:
            # FSDP2 over gloo on CPU ranks: one all-gather per unit forward (and backward when it
            # reshards), one reduce-scatter per unit backward; the rank's one thread waits for each.
            units = spec.model.num_layers + spec.model.vision_depth + 1
            calls = units * ((2 if reshard else 1) + 1)
            latency = calls * (hw.nvlink.base_s + hw.nvlink.hop_s * (dense_n - 1))
            seconds = (per_mb + latency) * m + once
            why = (
                f"{calls} gloo collectives/micro-batch over {dense_n} ranks, {per_mb * 1e3:,.3g} ms of bytes"
            )
        else:
            # Megatron FSDP prefetches the next layer's gather under this layer's compute: what
            # exceeds the compute stays exposed, and the first layer's gather always does.
            layers = max(spec.model.num_layers // max(lay.pp, 1), 1)
            exposed = max(per_mb - compute, 0.0) + per_mb / layers / 3
            seconds = exposed * m + once
            why = f"{per_mb * 1e3:,.3g} ms of gathers and reductions per micro-batch, {compute * 1e3:,.3g} ms of compute to hide them"
        out.add(Term.fsdp, seconds, why)
        return out
    overlap = spec.overlap.grad_reduce is True
    bucket = (spec.overlap.bucket_size or 128 * 1024**2) * gbytes
    # A step's compute is a third forward, two thirds backward: the reduction can hide under the
    # last micro-batch's backward, the gather under the first's forward.
    if overlap:
        # Reduced bucket by bucket under the last micro-batch's backward; the last bucket is exposed.
        last = reduce * min(1.0, bucket / max((dense_local + experts_local) * gbytes, 1.0))
        exposed_reduce = max(reduce - compute * 2 / 3, last)
    else:
        exposed_reduce = reduce
    exposed_gather = gather if spec.overlap.param_gather is not True else max(gather - compute / 3, 0.0)
    out.add(
        Term.dp_grad,
        exposed_reduce + exposed_gather,
        f"reduce-scatter {reduce * 1e3:,.3g} ms + all-gather {gather * 1e3:,.3g} ms over DP {dense_n} / "
        f"expert DP {expert_n}; overlap {'on' if overlap else 'off (the perf recipes)'}",
    )
    return out


def _optimizer(model: StepModel) -> Tally:
    out = Tally()
    spec, lay, hw = model.spec, model.lay, model.hw
    params = param_counts_of(spec.model)
    frozen = (params.vision if spec.freeze.vision else 0) + (params.projector if spec.freeze.projector else 0)
    trainable = params.total - frozen - (params.language if spec.freeze.language else 0)
    local = trainable / max(lay.world_size, 1)
    offloaded = spec.offload.optimizer_fraction if spec.engine is Engine.megatron else 0.0
    seconds = k.memory_s(hw, (1 - offloaded) * local * ADAM_BYTES_PER_PARAM)
    why = f"{local:,.3g} trainable params/rank x {ADAM_BYTES_PER_PARAM} B"
    if hw.synchronous:
        # torch's AdamW, one tensor at a time over the sharded parameters: ~12 ops per tensor.
        seconds += model.ops(12 * _tensor_count(spec.model))
    if offloaded > 0 and hw.host_memory_bytes_per_s > 0:
        # MCore's HybridDeviceOptimizer: the offloaded share steps on the host, its gradients copied
        # down and its parameters up, one after the other (overlap_cpu_optimizer_d2h_h2d is off).
        shard = offloaded * local
        host = shard * HOST_ADAM_BYTES_PER_PARAM / hw.host_memory_bytes_per_s
        copies = shard * (grad_bytes(spec)[0] + BF16_BYTES) / hw.host_link_bytes_per_s
        seconds += host + copies
        why += (
            f"; {offloaded:.0%} on the host: {host * 1e3:,.3g} ms of Adam, {copies * 1e3:,.3g} ms of copies"
        )
    out.add(Term.optimizer, seconds, why)
    return out


def _tensor_count(model: ModelConfig) -> int:
    """Parameter tensors of the torch engine's model: per decoder layer (norms, q/k/v/o, q/k norms,
    gate, experts' two), per ViT block (two norms, qkv and proj with biases, two MLP with biases),
    and the rest (embeddings, mergers, head)."""
    return model.num_layers * 12 + model.vision_depth * 12 + 10 + 6 * (1 + len(model.vision_deepstack_layers))


def _data(model: StepModel, step_s: float) -> Tally:
    """The loader's host time per step not hidden by its workers (the torch engine builds batches
    in its loop: all of it)."""
    out = Tally()
    hw, spec = model.hw, model.spec
    if hw.data_sample_s <= 0 and hw.data_patch_s <= 0:
        return out
    m = model.micro_batches
    per_mb = model.mb.samples * hw.data_sample_s + model.mb.patches * hw.data_patch_s
    workers = data_workers(spec).count
    total = per_mb * m
    exposed = total if workers <= 0 else max(total / workers - step_s, 0.0)
    out.add(
        Term.data,
        exposed,
        f"{per_mb * 1e3:,.3g} ms host time per micro-batch, {workers} worker(s)"
        + ("" if workers else " (built in the training loop)"),
    )
    return out


def not_modelled(spec: RunSpec, hw: Hardware) -> tuple[str, ...]:
    """What the step model does not represent for this point (the plan's "not modelled" list)."""
    out = list(NOT_MODELLED)
    if hw.data_sample_s <= 0 and hw.data_patch_s <= 0:
        out.append(
            "the data loader's host time: not measured for this cluster (moe-vlm calibrate --probe measures "
            "it on the machine it runs on)"
        )
    if spec.dispatcher.token_dispatcher is TokenDispatcher.allgather and spec.layout.ep > 1:
        out.append("the all-gather dispatcher: no published rate; priced as NCCL ring all-gathers")
    return tuple(out)
