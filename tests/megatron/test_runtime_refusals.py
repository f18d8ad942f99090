"""Issue 19, "Plans VALID, fails at run time": each combination, the library code that fails (or
refuses it) run on CPU, and the rule that now rejects it firing exactly there.

What runs here is the installed library's own code: Megatron FSDP's raw-data setter on a real TE
NVFP4Tensor, TE's userbuffer all-gather fill with a real NVFP4Quantizer, Megatron Core's router
top-k with TE's fused kernel, Megatron-LM's own argument validation (megatron/training/arguments.py,
shipped with megatron-core), Bridge's vision attention setup and Megatron Core's vision CUDA-graph
helper, and the allgather dispatcher on meta tensors (a meta tensor has no data: reading one on
the host fails exactly where a capturing CUDA stream forbids it). There is no GPU here: where the
library asks torch for the current CUDA device, it gets the CPU.

Where the issue's claim is wrong or narrower than stated, the test says so (optimizer offload on 3D
BF16; vision graphs with PP = 1).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from moe_vlm.knobs.bridge_recipe import select_recipe
from moe_vlm.rules import validate
from tests.conftest import make_spec
from tests.megatron.conftest import REPORT, RecipeCache, model_parallel_rank, needs_stack, runtime_updated

GB = ("engine=megatron", "dry_run=true", "cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2")
BLACKWELL = ("gb200", "b200", "gb300", "b300")
MODELS = ("qwen3_vl_30b_a3b", "qwen3_vl_235b_a22b", "qwen35_vl_35b_a3b")


def codes(*overrides: str) -> set[str]:
    return {f.code for f in validate(make_spec(*overrides)) if f.is_error}


updated = runtime_updated  # the engine's ConfigContainer after Bridge's runtime update


@pytest.fixture
def cpu_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's `torch.cuda.current_device()` calls get the CPU (there is no GPU here)."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")


@pytest.fixture
def process_group() -> Iterator[None]:
    """One gloo rank with Megatron's model-parallel groups, for one test: while it exists Bridge's
    runtime update sizes the job from it instead of WORLD_SIZE."""
    with model_parallel_rank():
        yield


# --- 1. NVFP4 primary weights in Megatron FSDP's buffers ----------------------------------------------


def nvfp4_weight(rows: int, cols: int) -> Any:
    """A TE NVFP4Tensor as TE lays one out: E2M1 values packed two per byte, rowwise (rows, cols / 2)."""
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer, NVFP4Tensor

    quantizer = NVFP4Quantizer()
    scale_rows, scale_cols = quantizer.get_scale_shape((rows, cols), columnwise=False)
    return NVFP4Tensor(
        (rows, cols),
        torch.bfloat16,
        rowwise_data=torch.zeros(rows, cols // 2, dtype=torch.uint8),
        rowwise_scale_inv=torch.zeros(scale_rows, scale_cols, dtype=torch.uint8),
        columnwise_data=None,
        columnwise_scale_inv=None,
        amax_rowwise=torch.zeros(1),
        amax_columnwise=None,
        fp4_dtype=quantizer.dtype,
        quantizer=quantizer,
        with_gemm_swizzled_scales=False,
        device=torch.device("cpu"),
    )


def mxfp8_weight(rows: int, cols: int) -> Any:
    """A TE MXFP8Tensor: one byte per value, rowwise (rows, cols)."""
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer, MXFP8Tensor

    quantizer = MXFP8Quantizer(fp8_dtype=tex.DType.kFloat8E4M3)
    return MXFP8Tensor(
        (rows, cols),
        torch.bfloat16,
        rowwise_data=torch.zeros(rows, cols, dtype=torch.uint8),
        rowwise_scale_inv=torch.zeros(rows, cols // 32, dtype=torch.uint8),
        columnwise_data=None,
        columnwise_scale_inv=None,
        fp8_dtype=tex.DType.kFloat8E4M3,
        quantizer=quantizer,
        with_gemm_swizzled_scales=False,
        device=torch.device("cpu"),
    )


@needs_stack
def test_megatron_fsdp_cannot_hold_an_nvfp4_weight(
    recipes: RecipeCache, engine_environment: Any, cpu_device: None
) -> None:
    from megatron.core.distributed.fsdp.src.megatron_fsdp import mixed_precision, param_and_grad_buffer

    # The run's config: Bridge's bf16_with_nvfp4_mixed keeps NVFP4 primary weights, gathered as such,
    # on Megatron FSDP (the first command), and Bridge's pre-flight accepts it.
    _, cfg = updated(recipes, engine_environment, *GB, "precision=nvfp4")
    assert cfg.ddp.use_megatron_fsdp and cfg.model.fp4_param and cfg.ddp.fp4_param_gather

    # Megatron FSDP takes every TE QuantizedTensor for FP8, and attaches each parameter to its buffer
    # slice viewed with the parameter's logical shape (param_and_grad_buffer.py:2941, 2955).
    source = inspect.getsource(param_and_grad_buffer)
    assert "new_param_data = wbuf.get_item_from_bucket(bucket, item_id).view(p_local.shape)" in source
    assert "fp8_set_raw_data(p_local, new_param_data)" in source
    rows, cols = 32, 64
    for weight, fits in ((nvfp4_weight(rows, cols), False), (mxfp8_weight(rows, cols), True)):
        assert mixed_precision.is_float8tensor(weight)
        slice_ = torch.zeros(rows * cols, dtype=torch.uint8).view(weight.shape)  # the buffer's uint8 slice
        if fits:
            mixed_precision.fp8_set_raw_data(weight, slice_)  # MXFP8: one byte per value, same shape
        else:
            with pytest.raises(
                AssertionError, match=r"Shape torch.Size\(\[32, 32\]\) of old_data doesn't match"
            ):
                mixed_precision.fp8_set_raw_data(weight, slice_)  # mixed_precision.py:238-240
            # On the wrap path the copy just before it (param_and_grad_buffer.py:2952-2953) already
            # fails: the packed (32, 32) bytes do not fill a (32, 64) slice. The issue cites the assert;
            # either way the model never wraps.
            with pytest.raises(RuntimeError, match="must match the size"):
                slice_.detach().copy_(mixed_precision.fp8_get_raw_data(weight))
    # Bridge's own NVFP4 perf recipes say so, and turn the packed weights off for Megatron FSDP.
    from megatron.bridge.perf_recipes.nemotronh import common as nemotronh

    assert "FP4 primary weights fault during buffer init" in inspect.getsource(nemotronh)
    assert "P004" in codes(*GB, "precision=nvfp4")
    assert "P004" not in codes(*GB, "precision=fp8mx") | codes(
        *GB, "parallelism=3d", "ep=8", "precision=nvfp4"
    )
    REPORT.append("runtime refusals: P004 confirmed (Megatron FSDP's fp8_set_raw_data on a TE NVFP4Tensor)")


# --- 2. NVFP4 with TE userbuffer TP overlap ---------------------------------------------------------


class _UserbuffersComm:
    """The userbuffer communicator's one query the fill makes before it looks at the quantizer (the
    real one, tex.CommOverlap, is built over CUDA IPC buffers)."""

    def with_cublasmp(self) -> bool:
        return False


@needs_stack
def test_te_userbuffers_refuse_the_nvfp4_quantizer(process_group: None, cpu_device: None) -> None:
    from transformer_engine.pytorch.module.base import fill_userbuffers_buffer_for_all_gather
    from transformer_engine.pytorch.tensor.nvfp4_tensor import NVFP4Quantizer

    local = torch.randn(8, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="Unsupported quantizer for Userbuffers"):
        fill_userbuffers_buffer_for_all_gather(
            _UserbuffersComm(), local, NVFP4Quantizer(), torch.distributed.group.WORLD
        )


@needs_stack
def test_nvfp4_runs_userbuffer_overlap_where_the_recipe_asks_for_it(
    recipes: RecipeCache, engine_environment: Any
) -> None:
    from megatron.bridge.training import initialize

    # Bridge starts userbuffers whenever the model's tp_comm_overlap survives its runtime update.
    assert "if model_config.tp_comm_overlap:\n        _initialize_tp_communicators" in inspect.getsource(
        initialize
    )
    three_d = (*GB, "parallelism=3d", "tp=2", "ep=4", "precision=nvfp4")
    for extra, overlap in (
        ("overlap.tp_comm=true", True),
        ("overlap.tp_comm=null", True),
        ("overlap.tp_comm=false", False),
    ):
        _, cfg = updated(recipes, engine_environment, *three_d, extra)
        assert cfg.model.fp4 and cfg.model.tp_comm_overlap is overlap, extra
        assert ("P005" in codes(*three_d, extra)) is overlap, extra


@needs_stack
@pytest.mark.parametrize(("cluster", "model"), [(c, m) for c in (*BLACKWELL, "h100", "h200") for m in MODELS])
def test_the_recipes_ask_for_tp_overlap_on_blackwell_and_router_fusion_everywhere(
    recipes: RecipeCache, cluster: str, model: str
) -> None:
    """What P005 (TP overlap, Blackwell) and X009 (router fusion) assume for a null knob, on every
    perf recipe the engine can pick."""
    spec = make_spec("engine=megatron", "dry_run=true", f"cluster={cluster}", f"model={model}")
    cfg = recipes.config(spec)
    assert select_recipe(spec) is not None
    assert cfg.model.moe_router_fusion is True
    if cluster in BLACKWELL:
        assert cfg.comm_overlap is not None and cfg.comm_overlap.tp_comm_overlap is True


# --- 3. An fp64 router through TE's fused router --------------------------------------------------------


@needs_stack
def test_te_fused_router_refuses_float64(recipes: RecipeCache, engine_environment: Any) -> None:
    from megatron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    logits = torch.randn(16, 8, dtype=torch.float64)  # moe_router_dtype='fp64' (moe/router.py:103-108)
    probs, routing_map = topk_routing_with_score_function(logits, 2, use_pre_softmax=False, fused=False)
    assert probs.dtype == torch.float64 and routing_map.sum() == 32  # unfused: fp64 routes fine
    with pytest.raises(ValueError, match="Current TE does not support float64 router type"):
        topk_routing_with_score_function(logits, 2, use_pre_softmax=False, fused=True)
    # The third command resolves to exactly that: fp64 logits, the recipe's fused router.
    _, cfg = updated(recipes, engine_environment, *GB, "router.dtype=fp64")
    assert (cfg.model.moe_router_dtype, cfg.model.moe_router_fusion) == ("fp64", True)
    assert "X009" in codes(*GB, "router.dtype=fp64")
    assert "X009" not in codes(*GB, "router.dtype=fp64", "fusion.moe_router_fusion=false")
    assert "X009" not in codes(*GB, "router.dtype=fp32", "fusion=all")
    REPORT.append("runtime refusals: X009 confirmed (TE fused top-k refuses float64 logits)")


# --- 4 and 8. Megatron's argument validation: optimizer offload, param-gather overlap --------------------


def megatron_args(*flags: str) -> Any:
    """Megatron-LM's own parse_args + validate_args for a small GPT with these flags (one rank)."""
    from megatron.training import arguments

    argv = [
        "pretrain_gpt.py",
        "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", "1",
        "--global-batch-size", "8", "--bf16", "--use-distributed-optimizer",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--mock-data",
        *flags,
    ]  # fmt: skip
    saved = sys.argv
    sys.argv = argv
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = arguments.parse_args()
            arguments.validate_args(args)
    finally:
        sys.argv = saved
    return args


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")


@needs_stack
def test_megatron_refuses_param_gather_overlap_without_grad_reduce_overlap(
    recipes: RecipeCache, engine_environment: Any, one_rank: None
) -> None:
    megatron_args("--overlap-grad-reduce", "--overlap-param-gather")  # the quiet case validates
    with pytest.raises(AssertionError, match="Must use --overlap-param-gather with --overlap-grad-reduce"):
        megatron_args("--overlap-param-gather")  # arguments.py:994-995
    # Bridge passes the eighth command through: both flags reach ddp as given.
    command = (*GB, "parallelism=3d", "ep=8", "overlap.param_gather=true", "overlap.grad_reduce=false")
    _, cfg = updated(recipes, engine_environment, *command)
    assert (cfg.ddp.overlap_param_gather, cfg.ddp.overlap_grad_reduce) == (True, False)
    assert "O015" in codes(*command)
    assert "O015" not in codes(*GB, "parallelism=3d", "ep=8", "overlap=dp")
    REPORT.append("runtime refusals: O015 confirmed (megatron/training/arguments.py validate_args)")


@needs_stack
@pytest.mark.parametrize("model", ["qwen3_vl_30b_a3b", "qwen35_vl_35b_a3b"])
def test_a_null_grad_reduce_is_off_in_the_recipes(
    recipes: RecipeCache, engine_environment: Any, model: str
) -> None:
    """O015 reads overlap.grad_reduce=null as off on 3D: what Bridge's runtime update leaves."""
    command = ("engine=megatron", "dry_run=true", "cluster=gb200", f"model={model}", "nodes=2",
               "parallelism=3d", "ep=8", "overlap.param_gather=true")  # fmt: skip
    _, cfg = updated(recipes, engine_environment, *command)
    assert (cfg.ddp.overlap_param_gather, cfg.ddp.overlap_grad_reduce) == (True, False)
    assert "O015" in codes(*command)


@needs_stack
def test_optimizer_offload_against_megatrons_validation(
    recipes: RecipeCache, engine_environment: Any, one_rank: None
) -> None:
    from megatron.core.optimizer import distrib_optimizer

    offload = ("--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0")
    # The issue is right that Megatron-LM's validation wants the precision-aware optimizer
    # (arguments.py:1803-1807), and that Bridge never runs that validation ...
    with pytest.raises(AssertionError, match="use-precision-aware-optimizer"):
        megatron_args(*offload)
    megatron_args(*offload, "--use-precision-aware-optimizer")
    # ... but wrong that the project's BF16 3D runs need it: without it Megatron Core keeps fp32
    # main-weight shards (distrib_optimizer.py:421-447) and rebuilds the offloading optimizer over them
    # (:778-781), the path Bridge maintains a fix-up for (training/setup.py:414-420). So 3D BF16 plans.
    source = inspect.getsource(distrib_optimizer.DistributedOptimizer.__init__)
    fsdp_return = source.index("if self.ddp_config.use_megatron_fsdp:")
    rebuild = source.index("self.optimizer = HybridDeviceOptimizer(")
    assert fsdp_return < rebuild  # Megatron FSDP returns before the rebuild: O010
    _, cfg = updated(recipes, engine_environment, *GB, "parallelism=3d", "ep=8", "offload=optimizer")
    assert cfg.optimizer.optimizer_cpu_offload and not cfg.optimizer.use_precision_aware_optimizer
    assert not codes(*GB, "parallelism=3d", "ep=8", "offload=optimizer")
    assert "O010" in codes(*GB, "offload=optimizer")  # the fourth command: Megatron FSDP
    # FP8 parameter gather with current or MXFP8 scaling is refused again, even precision-aware
    # (arguments.py:1808-1811): Bridge's fp8cs / fp8mx recipes gather FP8 parameters.
    for precision, recipe in (("fp8cs", "tensorwise"), ("fp8mx", "mxfp8")):
        _, cfg = updated(recipes, engine_environment, *GB, "parallelism=3d", "ep=8", "offload=optimizer",
                         f"precision={precision}")  # fmt: skip
        assert cfg.ddp.fp8_param_gather and cfg.mixed_precision.fp8_recipe == recipe
        with pytest.raises(AssertionError, match="must be used in conjunction with `--fp8-recipe delayed`"):
            megatron_args(*offload, "--use-precision-aware-optimizer", "--fp8-format", "hybrid",
                          "--fp8-recipe", recipe, "--fp8-param-gather")  # fmt: skip
        assert "O014" in codes(*GB, "parallelism=3d", "ep=8", "offload=optimizer", f"precision={precision}")
    REPORT.append("runtime refusals: O014 confirmed (megatron/training/arguments.py validate_args)")


# --- 5 and 6. Vision-encoder CUDA graphs ------------------------------------------------------------------


@needs_stack
def test_vision_graph_mode_drops_the_per_image_attention(cpu_device: None) -> None:
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import (
        _vision_forward_packed_attention_setup,
    )
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_transformer_engine_spec
    from megatron.core.transformer.enums import AttnMaskType

    grid = torch.tensor([[1, 8, 8], [1, 4, 4]])  # two images: 64 + 16 patches
    hidden = torch.zeros(80, 1, 8)
    per_image = types.SimpleNamespace(cu_seqlens=[0, 64, 80])
    eager = _vision_forward_packed_attention_setup(False, hidden, 80, 80, grid, lambda _grid: per_image)
    assert eager == (per_image, None)  # eager: attention split per image (cu_seqlens)
    graphed = _vision_forward_packed_attention_setup(True, hidden, 80, 80, grid, lambda _grid: per_image)
    assert graphed == (None, None)  # graph mode: no per-image split, no mask at all
    # ... and the ViT's attention is built without a mask (vit_layer_specs.py:47).
    attention = get_vit_layer_with_transformer_engine_spec().submodules.self_attention
    assert attention.params["attn_mask_type"] is AttnMaskType.no_mask


@needs_stack
@pytest.mark.parametrize("vision_scope", [[], ["attn"], ["mlp"]])
def test_vision_graph_capture_has_no_rotary_embeddings(
    process_group: None, cpu_device: None, monkeypatch: pytest.MonkeyPatch, vision_scope: list[str]
) -> None:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.cuda_graphs import VisionTECudaGraphHelper
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import TransformerLayer
    from transformer_engine.pytorch import graph

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TransformerConfig(
            num_layers=2, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True,
            cuda_graph_impl="transformer_engine", cuda_graph_modules=vision_scope,
        )  # fmt: skip
    spec = get_gpt_layer_local_spec()
    layers = [TransformerLayer(config, spec.submodules, layer_number=i + 1) for i in range(2)]
    # MCore's own sample arguments for the vision graphs: the real method, its CUDA tensors on the CPU.
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **kw: zeros(*a, **{**kw, "device": "cpu"}))
    helper = types.SimpleNamespace(
        flattened_callables=layers, num_microbatches=3, config=config, seq_length=32
    )
    args, kwargs = VisionTECudaGraphHelper._get_sample_arguments(helper, order=None)
    # One graph per layer per micro-batch (Bridge passes get_num_microbatches(): train.py:298) ...
    assert len(args) == len(kwargs) == 3 * 2
    # ... captured with hidden_states (+ a causal mask when attention is inside): no rotary embeddings,
    # and TE's replay feeds only the keyword arguments it captured (graph.py:1189-1202).
    captures_attention = not vision_scope or "attn" in vision_scope
    assert all(set(k) == ({"attention_mask"} if captures_attention else set()) for k in kwargs)
    assert "[user_kwargs[key] for key in kwargs_keys]" in inspect.getsource(graph)
    if captures_attention:
        assert kwargs[0]["attention_mask"].shape == (1, 1, 32, 32)  # L x L, per graph


@needs_stack
def test_vision_graphs_are_rejected_whatever_the_pipeline(
    recipes: RecipeCache, engine_environment: Any
) -> None:
    """The issue's fifth and sixth commands. Item 6 says the graph count grows with PP > 1; the helper
    captures num_microbatches x depth graphs at PP = 1 as well (the count of micro-batches is what
    grows): at 8,192 patches each graph holds an 8,192 x 1,152 bf16 input and an 8,192^2 bool mask."""
    for extra in (("nodes=2",), ("nodes=4", "pp=2")):
        command = (*GB[:-1], *extra, "parallelism=3d", "ep=8", "cuda_graph.vision=true",
                   "cuda_graph.vision_max_seq_length=8192")  # fmt: skip
        spec, cfg = updated(recipes, engine_environment, *command)
        assert cfg.model.vision_cuda_graph_impl == "transformer_engine"
        assert codes(*command) == {"O016"}
        micro_batches = spec.gbs // (spec.mbs * spec.layout.dp)
        graphs = micro_batches * spec.model.vision_depth
        static = graphs * (8192 * spec.model.vision_hidden_size * 2 + 8192 * 8192)
        assert micro_batches == 64 and static > 100 * 1024**3, (micro_batches, static)
    assert "O016" not in codes(*GB, "parallelism=3d", "ep=8", "cuda_graph=te_moe")


# --- 7. The moe graph scope and the allgather dispatcher ---------------------------------------------------


@needs_stack
def test_allgather_dispatch_reads_token_counts_on_the_host(process_group: None) -> None:
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher
    from megatron.core.transformer.transformer_config import TransformerConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = TransformerConfig(
            num_layers=1, hidden_size=16, num_attention_heads=2, num_moe_experts=4, moe_router_topk=2,
            moe_token_dispatcher_type="allgather", moe_expert_capacity_factor=1.0,
            moe_pad_expert_input_to_capacity=True, use_cpu_initialization=True,
        )  # fmt: skip
    dispatcher = MoEAllGatherTokenDispatcher(
        4, [0, 1, 2, 3], config, pg_collection=ProcessGroupCollection.use_mpu_process_groups()
    )
    meta = torch.device("meta")
    dispatcher.routing_map = torch.zeros(8, 4, dtype=torch.bool, device=meta)
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor") as raised:
        dispatcher.dispatch_postprocess(torch.zeros(8, 16, device=meta), torch.zeros(8, 4, device=meta))
    # Where: the device-to-host copy of the token counts (token_dispatcher.py:317).
    assert "tokens_per_expert = self.local_map.sum(dim=0).long().cpu()" in str(raised.traceback[-1].statement)
    command = (
        *GB,
        "parallelism=3d",
        "ep=8",
        "cuda_graph=te_moe",
        "cuda_graph.scope=[moe]",
        "router=drop_and_pad",
    )
    assert codes(*command, "dispatcher=allgather") == {"G013"}
    assert not codes(*command, "dispatcher=alltoall")


# --- 9. profiling=nsys outside the Slurm launcher ------------------------------------------------------------


@needs_stack
def test_nsys_on_one_node_is_refused_before_torchrun_starts(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's single-node path relaunches itself with torchrun (launch.py), which runs no
    nsys: Bridge's cudaProfilerStart/Stop (training/profiling.py) would record nothing, silently."""
    from moe_vlm.base.errors import EngineUnavailable

    # The module (moe_vlm.engines.megatron re-exports its `launch` function under the same name).
    megatron_launch = importlib.import_module("moe_vlm.engines.megatron.launch")

    started: list[object] = []
    monkeypatch.setattr(megatron_launch, "_relaunch_with_torchrun", lambda *a: started.append(a))
    for name in ("RANK", "SLURM_PROCID", "MOE_VLM_NSYS_REPORT"):
        monkeypatch.delenv(name, raising=False)
    spec = make_spec("engine=megatron", "cluster=b200", "model=qwen3_vl_30b_a3b", "profiling=nsys")
    with pytest.raises(EngineUnavailable, match="not running under Nsight Systems"):
        megatron_launch.launch(spec, {}, tmp_path)
    assert not started
    # Under the Slurm launcher's wrapper the same rank goes on (to the GPU check, here the CPU's end).
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("MOE_VLM_NSYS_REPORT", str(tmp_path / "nsys" / "rank0"))
    with pytest.raises(EngineUnavailable, match="needs GPUs"):
        megatron_launch.launch(spec, {}, tmp_path)
    assert os.environ["MOE_VLM_NSYS_REPORT"].endswith("rank0")


@needs_stack
def test_a_negative_weight_decay_fails_in_both_engines_optimizers_and_c005_rejects_it() -> None:
    """Megatron Core's own scheduler (optimizer_param_scheduler.py:168) and torch's AdamW
    (torch/optim/adam.py:66-67) refuse it when the optimizer is built; C005 refuses it before."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = torch.optim.SGD(params, lr=0.1)

    def scheduler(weight_decay: float) -> OptimizerParamScheduler:
        return OptimizerParamScheduler(
            optimizer,
            init_lr=0.0,
            max_lr=1e-4,
            min_lr=0.0,
            lr_warmup_steps=1,
            lr_decay_steps=10,
            lr_decay_style="constant",
            start_wd=weight_decay,
            end_wd=weight_decay,
            wd_incr_steps=10,
            wd_incr_style="constant",
        )

    scheduler(0.033)  # the recipes' value builds
    with pytest.raises(AssertionError):
        scheduler(-0.1)
    with pytest.raises(ValueError, match="weight_decay"):
        torch.optim.AdamW(params, weight_decay=-0.1)
    assert "C005" in codes(*GB, "weight_decay=-0.1")
    assert "C005" not in codes(*GB, "weight_decay=0.033")
