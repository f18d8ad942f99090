"""Per-rank peak memory, estimated before anything runs, as a sum of named terms.

    estimate(spec) -> MemoryEstimate(terms, capacity, peak stage, what the engine measures)

Two engines, two quantities, one vocabulary of terms:

Megatron engine (GPU; what decides an OOM is the GPU's whole memory)
    parameters          bf16 weights held on this GPU: dense parts / TP (the vision tower,
                        projector and embedding on the first pipeline stage, the output layer on
                        the last), routed experts / (EP x ETP); Megatron FSDP shards both over
                        its data-parallel group (dense: DP x CP, experts: expert DP)
    quantized_weights   precision=fp8cs|fp8mx|nvfp4: the decoder's GEMM weights as Transformer
                        Engine keeps them (quantized primary weights + the backward copy), in
                        place of their bf16 share of `parameters` (bytes: moe_vlm/config/precision.py)
    gradients           main gradients of trainable parameters: bf16, or fp32 on 3D with
                        overlap.grad_reduce_in_fp32 (the perf recipes: off; Megatron FSDP keeps
                        the parameters' dtype); frozen modules hold none
    optimizer_state     fp32 main weights + Adam m and v (12 bytes per trainable parameter),
                        sharded by the distributed optimizer (3D) or by FSDP's sharding strategy,
                        within an HSDP replica (parallelism.dp_outer) unless dp_outer_sharding=optim
    optimizer_offload   minus the Adam m, v of offload.optimizer_fraction of them (host memory)
    fsdp_buffers        Megatron FSDP's unsharded working set: two units of bf16 parameters
                        (current + prefetched) and one unit of fp32 gradients before reduce-scatter
    decoder_activations what autograd keeps for one micro-batch through this stage's decoder
                        layers (bf16, TE flash attention, no dropout), under the recompute mode
    activation_offload  minus the saved tensors of the first offload.activation_layers decoder
                        layers, which TE's CPU offload keeps in host memory until backward
    vision_activations  the same for the ViT and the patch merger, from the data kind's patches
                        (padded to the vision CUDA graph's length when cuda_graph.vision is on)
    pipeline_in_flight  1F1B: the first stage holds min(PP, micro-batches) micro-batches;
                        interleaving multiplies by 1 + (PP-1)/(PP x VP) (Megatron-LM
                        theoretical_memory_usage.py)
    logits              last stage: bf16 logits + what the cross entropy keeps for backward: TE's
                        fused one a bf16 copy (4 B per token per vocab entry / TP), Megatron's
                        the fp32 softmax (6 B)
    dispatcher_buffers  DeepEP / HybridEP communication buffers (cudaMalloc'd, outside the
                        PyTorch allocator; sizing and sources in _deepep_bytes/_hybridep_bytes)
    cuda_graph_pool     static inputs/outputs of the captured scopes, per layer per micro-batch
    framework_overhead  CUDA context, cuBLAS/NCCL buffers (a constant) + allocator fragmentation
                        (a fraction of what the allocator holds)

Torch engine on CPU (cluster=local; what the engine records is the process peak RSS)
    runtime_baseline    the Python/torch/transformers runtime, the engine's imports, the gloo
                        group and the data pipeline: MEASURED (scripts/calibrate_memory.py)
    parameters          fp32 weights: the engine builds the whole model on every rank, then
                        FSDP2 keeps 1/world of it (+ the unsharded units in use)
    gradients           fp32, sharded like the parameters; frozen modules hold none
    optimizer_state     AdamW exp_avg + exp_avg_sq, fp32, sharded
    decoder_activations counted from autograd's saved tensors of transformers' Qwen3-VL-MoE in
                        fp32 with SDPA (tests/unit/test_memory.py checks the count against autograd)
    vision_activations  the same for the ViT and the patch merger, plus the batch's pixel_values
    logits              the logits and their gradient, alive at the start of backward
    heap_retention      glibc keeps freed heap pages: a measured fraction of the activation peak

Every number a user may want to check is in the term's `detail`, in words and figures.

The package, one concern a module: estimate (Term, MemoryEstimate, the stated constants), images
(the image budget per micro-batch), micro_batch (the positions a micro-batch computes: padded, or
the data's p99 when packed), shared (parameter counts from moe_vlm.config.arch, gradient flow,
recompute, framework overhead), megatron and torch_cpu (one function per term, an assembler
each; megatron_saved holds Megatron's saved-tensor tables), predict (`estimate`, the entry
point), levers (single changes that lower memory and the first that fits).
"""

from moe_vlm.perf.memory.estimate import (
    ADAM_STATE_BYTES,
    ADAMW_MOMENTS_BYTES,
    BF16,
    FP32,
    GIB,
    GPU_ESTIMATE_UNCERTAINTY,
    GPU_FRAGMENTATION_FRACTION,
    GPU_FRAMEWORK_CONSTANT_GIB,
    MIB,
    PIXEL_VALUE_COPIES,
    THIN_HEADROOM_FRACTION,
    TORCH_CPU_HEAP_RETENTION_FRACTION,
    TORCH_CPU_RUNTIME_BASELINE_GIB,
    MemoryEstimate,
    Term,
)
from moe_vlm.perf.memory.images import ImageBudget, image_budget, patches_for_image, resized_pixels
from moe_vlm.perf.memory.levers import (
    SELECTIVE_DEFAULT,
    Fit,
    Variant,
    fits_after,
    memory_variants,
    with_recompute,
)
from moe_vlm.perf.memory.megatron import megatron_stage
from moe_vlm.perf.memory.predict import estimate
from moe_vlm.perf.memory.shared import ParamCounts, Training, param_counts, training_of
from moe_vlm.perf.memory.torch_cpu import torch_decoder_bytes, torch_vision_bytes

__all__ = [
    "ADAMW_MOMENTS_BYTES",
    "ADAM_STATE_BYTES",
    "BF16",
    "FP32",
    "GIB",
    "GPU_ESTIMATE_UNCERTAINTY",
    "GPU_FRAGMENTATION_FRACTION",
    "GPU_FRAMEWORK_CONSTANT_GIB",
    "MIB",
    "PIXEL_VALUE_COPIES",
    "SELECTIVE_DEFAULT",
    "THIN_HEADROOM_FRACTION",
    "TORCH_CPU_HEAP_RETENTION_FRACTION",
    "TORCH_CPU_RUNTIME_BASELINE_GIB",
    "Fit",
    "ImageBudget",
    "MemoryEstimate",
    "ParamCounts",
    "Term",
    "Training",
    "Variant",
    "estimate",
    "fits_after",
    "image_budget",
    "megatron_stage",
    "memory_variants",
    "param_counts",
    "patches_for_image",
    "resized_pixels",
    "torch_decoder_bytes",
    "torch_vision_bytes",
    "training_of",
    "with_recompute",
]
