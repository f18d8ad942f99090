"""The library's own validation of one planned point, as deep as a CPU allows.

The rule catalogue (moe_vlm/rules/) is written after reading the library; it misses what nobody
read. These checks run the library's code on the configuration the engine would run (THE table
applied to the recipe, moe_vlm/engines/megatron/config.py), and report what it refuses:

- LIB-BRIDGE: Bridge's ``runtime_config_update`` (megatron/bridge/training/config.py:1853-1888):
  the recipe's env, mixed-precision and comm-overlap setup, then ``ConfigContainer.validate``
  (:1136), which finalises the model (Megatron Core's TransformerConfig.__post_init__), the DDP
  and optimizer configs (DistributedDataParallelConfig / OptimizerConfig.__post_init__ through
  their ``finalize``, :111-142), the dataset, CUDA graphs and the flex dispatcher;
- LIB-VISION: the vision encoder's TransformerConfig, as the provider builds it
  (megatron/bridge/models/qwen_vl/modelling_qwen3_vl/transformer_config.py:63-160, called from
  modelling_qwen3_vl/model.py:313 and qwen35_vl_provider.py:510). It assigns fields after the
  constructor, so Megatron Core's TransformerConfig checks never see the final values: here they
  run on them (``dataclasses.replace`` re-runs ``__post_init__``);
- LIB-TE-RECIPE: Transformer Engine's quantization recipe for the model config (Megatron Core's
  get_fp8_recipe / get_fp4_recipe, core/fp8_utils.py:714, core/fp4_utils.py:219) and the quantizers
  TE makes from it (RecipeState.make_quantizers);
- LIB-TE-UB: TP userbuffer overlap with those quantizers: TE's all-gather buffer fill
  (transformer_engine/pytorch/module/base.py:607-754), called up to its format dispatch, and for MXFP8
  on the shard Bridge sizes the buffers for (training/initialize.py:355-358) up to its rows check
  (:709-713);
- LIB-ROUTER: the router's fused top-k kernel with the router's dtype (megatron/core/transformer/
  moe/router.py:103-107 picks the dtype, moe/moe_utils.py:772-790 calls TE's
  fused_topk_with_score_function, transformer_engine/pytorch/router.py:345-346 checks it);
- LIB-MOE: the MoE layer's run-time refusal of TP > 1 without sequence parallelism
  (megatron/core/transformer/moe/moe_layer.py:629-633), run on the model config as the layer gets it;
- LIB-ARGS: Megatron-LM's training argument validation (megatron/training/arguments.py:388,
  ``validate_args``) on the arguments that name the same fields (ARGS_FROM_CONFIG maps them).
  Bridge does not run it; where it refuses what Bridge accepts, rules/library.py ports the check.

`check_point(spec)` builds the configuration (the recipe once per process, then a copy per point)
and runs them all; `check_config` runs them
on a configuration already built (tests/megatron/test_fuzz_combinations.py reuses recipes).
Without the Megatron stack: one LIB-STACK warning saying the checks did not run, never silence.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from types import SimpleNamespace
from typing import Any

from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.config import config_from_base
from moe_vlm.engines.megatron.effective import rank_environment, runtime_update
from moe_vlm.engines.megatron.stack import stack_problem, where_raised


class Check(StrEnum):
    bridge = "LIB-BRIDGE"
    vision = "LIB-VISION"
    te_recipe = "LIB-TE-RECIPE"
    userbuffers = "LIB-TE-UB"
    router = "LIB-ROUTER"
    moe = "LIB-MOE"
    args = "LIB-ARGS"
    stack = "LIB-STACK"  # the checks did not run here


@dataclass(frozen=True)
class LibraryFinding:
    check: Check
    message: str  # the library's exception, as it raised it
    where: str = ""  # " at <library file>:<line>"

    def line(self) -> str:
        return f"{self.check.value}: {self.message}{self.where}"

    @property
    def refuses(self) -> bool:
        """A refusal by the library (LIB-STACK only says the checks did not run)."""
        return self.check is not Check.stack

    @property
    def fix(self) -> str:
        return STACK_FIX if self.check is Check.stack else LIBRARY_FIX


LIBRARY_FIX = (
    "change the combination; the rule catalogue let it through, so add a rule that cites the library "
    "line above (moe_vlm/rules/library.py, docs/adding-a-knob.md)"
)
STACK_FIX = "install the Megatron stack to run them"


class _Ok(Exception):
    """Raised by a probe past the library check it exercises: the check passed."""


def _exception(check: Check, exc: BaseException) -> LibraryFinding:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return LibraryFinding(check, text[:400], where_raised(exc))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The library prints and warns while it validates: the findings say what matters."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def cpu_device() -> Iterator[None]:
    """TE's quantizers put their constants on ``torch.cuda.current_device()`` (NVFP4's Hadamard
    signs, tensor/nvfp4_tensor.py:175-177): here that device is the CPU."""
    import torch

    current = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    try:
        yield
    finally:
        torch.cuda.current_device = current


# --- the vision encoder's TransformerConfig ---------------------------------------------------


def vision_config(model: Any) -> Any:
    """The ViT's TransformerConfig as the provider builds it (None: the model has no such ViT)."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_config import get_vision_model_config

    hf_vision = getattr(model, "vision_config", None)
    if hf_vision is None:
        return None
    return get_vision_model_config(hf_vision, megatron_config=model)


def _vision(cfg: Any, spec: RunSpec) -> None:
    built = vision_config(cfg.model)
    if built is not None:
        # The constructor's checks on the values the provider assigned after construction.
        dataclasses.replace(built)


# --- Transformer Engine: the quantization recipe, its quantizers, userbuffers -----------------


def quantizers(model: Any) -> list[Any]:
    """The forward quantizers TE makes from the recipe Megatron Core picks for `model` ([] in BF16)."""
    from transformer_engine.pytorch.quantization import RecipeState

    if getattr(model, "fp4", None):
        from megatron.core.fp4_utils import get_fp4_recipe

        recipe = get_fp4_recipe(model)
    elif getattr(model, "fp8", None):
        from megatron.core.fp8_utils import get_fp8_recipe

        recipe = get_fp8_recipe(model)
    else:
        return []
    state = RecipeState.create(recipe, mode="forward", num_quantizers=3)
    return list(state.make_quantizers())


def _te_recipe(cfg: Any, spec: RunSpec) -> None:
    quantizers(cfg.model)


class _Userbuffers:
    """The userbuffers communicator's answers that TE's buffer fill reads (base.py:630, 647, 663, 687):
    no buffer is touched. Without `fp8` a supported format reaches `is_fp8_ubuf` or a cast, which end
    the probe (only the format dispatch is under test); with it, the MXFP8 branch goes on to its own
    check of the shard's rows."""

    def __init__(self, fp8: bool = False) -> None:
        self.fp8 = fp8

    def with_cublasmp(self) -> bool:
        return False

    def is_fp8_ubuf(self) -> bool:
        if not self.fp8:
            raise _Ok
        return True

    def copy_into_buffer(self, tensor: Any, local_chunk: bool = False) -> None:
        return None


def _gloo_group() -> Any:
    import torch

    return torch.distributed.ProcessGroupGloo(torch.distributed.HashStore(), 0, 1)


def userbuffer_shard(cfg: Any) -> tuple[int, int]:
    """One TP rank's chunk of the all-gather userbuffers, rows x hidden, as Bridge asks TE for them:
    its own _initialize_tp_communicators (training/initialize.py:355-358, (seq_length x MBS / CP) x
    hidden) with TE's initialize_ub replaced by a recorder; TE splits the rows over TP (the local
    chunk every all-gather input must fill, comm_gemm_overlap copy_into_buffer)."""
    from unittest import mock

    import transformer_engine.pytorch as te
    from megatron.bridge.training.initialize import _initialize_tp_communicators

    asked: dict[str, Any] = {}

    def record(shape: list[int], tp_size: int, **_: Any) -> None:
        asked.update(shape=shape, tp=tp_size)

    with mock.patch.object(te, "initialize_ub", record):
        _initialize_tp_communicators(cfg.model, cfg.train.micro_batch_size)
    rows, hidden = asked["shape"]
    return rows // max(int(asked["tp"]), 1), hidden


def mxfp8_userbuffer_fill(rows: int, hidden: int) -> None:
    """TE's userbuffer all-gather fill (module/base.py:679-715) of one TP rank's MXFP8 shard, rows x
    hidden (meta tensors: nothing allocated), with the rowwise usage the column-parallel forward sets
    (layernorm_linear.py:300): raises TE's ValueError when it refuses the rows ('Userbuffers requires
    MXFP8 tensor dims that are divisible by 128', :709-713). The shard says its scales are swizzled,
    which TE refuses right after the rows (:714): that refusal is the probe's end, the rows passed."""
    import torch
    import transformer_engine_torch as tex  # registered by transformer_engine.pytorch's import
    from transformer_engine.pytorch.module.base import fill_userbuffers_buffer_for_all_gather
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer
    from transformer_engine.pytorch.tensor.storage.mxfp8_tensor_storage import MXFP8TensorStorage

    quantizer = MXFP8Quantizer(fp8_dtype=tex.DType.kFloat8E4M3)
    quantizer.set_usage(rowwise=True, columnwise=False)
    shard = MXFP8TensorStorage(
        torch.empty(rows, hidden, dtype=torch.uint8, device="meta"),
        torch.empty(rows, max(hidden // 32, 1), dtype=torch.uint8, device="meta"),
        None,
        None,
        tex.DType.kFloat8E4M3,
        None,
        True,
        fake_dtype=torch.bfloat16,
    )
    try:
        fill_userbuffers_buffer_for_all_gather(_Userbuffers(fp8=True), shard, quantizer, _gloo_group())
    except ValueError as exc:
        if "unswizzled scales" not in str(exc):
            raise


def _userbuffers(cfg: Any, spec: RunSpec) -> None:
    if not getattr(cfg.model, "tp_comm_overlap", False):
        return
    import torch
    from transformer_engine.pytorch.module.base import fill_userbuffers_buffer_for_all_gather
    from transformer_engine.pytorch.tensor.mxfp8_tensor import MXFP8Quantizer

    group = _gloo_group()
    for quantizer in quantizers(cfg.model):
        if isinstance(quantizer, MXFP8Quantizer):
            # Its branch checks the shard's rows: the shard Bridge sizes the buffers for.
            mxfp8_userbuffer_fill(*userbuffer_shard(cfg))
            continue
        # Each other format's branch first casts (FP8) or asks the communicator (is_fp8_ubuf): a
        # format with a branch ends in _Ok or a cast that needs a GPU; one without raises at :754.
        try:
            fill_userbuffers_buffer_for_all_gather(_Userbuffers(), torch.zeros(16, 16), quantizer, group)
        except _Ok:
            continue
        except ValueError as exc:
            if "Unsupported quantizer" in str(exc):
                raise
        except Exception:  # the cast on CPU: the format has a branch
            continue


# --- the router's fused kernel ------------------------------------------------------------------

_ROUTER_DTYPES = {"fp32": "float32", "fp64": "float64"}


def _router(cfg: Any, spec: RunSpec) -> None:
    model = cfg.model
    if not getattr(model, "moe_router_fusion", False) or not getattr(model, "num_moe_experts", None):
        return
    import torch
    from transformer_engine.pytorch.router import fused_topk_with_score_function

    # router.py:103-107: the router's dtype, else the input's (the model's params_dtype).
    name = _ROUTER_DTYPES.get(str(model.moe_router_dtype))
    dtype = getattr(torch, name) if name else model.params_dtype
    logits = torch.zeros(2, model.num_moe_experts, dtype=dtype)
    try:
        # A routing-map format no kernel has: TE validates it right after the dtype (router.py:347),
        # so the probe stops there and never launches a kernel.
        fused_topk_with_score_function(
            logits,
            model.moe_router_topk,
            False,
            None,
            None,
            None,
            "softmax",
            None,
            routing_map_format="probe",
        )
    except ValueError as exc:
        if "float64" in str(exc) or "router type" in str(exc):
            raise
    except (KeyError, TypeError):
        pass


# --- the MoE layer's run-time check ---------------------------------------------------------------


class _MoeLayer:
    """What MoELayer.forward reads before its first work: training, its attention TP group's size and
    its config (moe_layer.py:629); the next attribute it asks for (:637) ends the probe."""

    training = True

    def __init__(self, config: Any, tp: int) -> None:
        self.config = config
        self.attn_tp_group = SimpleNamespace(size=lambda: tp)

    def __getattr__(self, name: str) -> Any:
        raise _Ok


def _moe(cfg: Any, spec: RunSpec) -> None:
    """MoELayer.forward's refusal of TP > 1 without sequence parallelism in training (megatron/core/
    transformer/moe/moe_layer.py:629-633), a run-time check no config validation runs, on the
    configuration the layer would get."""
    model = cfg.model
    if not getattr(model, "num_moe_experts", None):
        return
    from megatron.core.transformer.moe.moe_layer import MoELayer

    with contextlib.suppress(_Ok):
        MoELayer.forward(_MoeLayer(model, model.tensor_model_parallel_size), None)


# --- Megatron-LM's training argument validation -----------------------------------------------

# Arguments whose name differs from the ConfigContainer field that holds the same setting. The
# model's renamed ones are Megatron-LM's own args -> TransformerConfig map read backwards
# (megatron/training/argument_utils.py:307-311); the virtual stages are the argument validate_args
# derives virtual_pipeline_model_parallel_size from (arguments.py:942-943; left unset it sets the
# size to None at :949 and checks the layers as if there were no virtual stages).
ARGS_FROM_CONFIG: dict[str, str] = {
    "num_experts": "model.num_moe_experts",
    # Without these, an uneven split (the 235B GB200/B200 recipes' 10 + 6 x 12 + 12 = 94) meets
    # "Number of layers should be divisible by the pipeline-model-parallel size" (arguments.py:951-963).
    "decoder_first_pipeline_num_layers": "model.num_layers_in_first_pipeline_stage",
    "decoder_last_pipeline_num_layers": "model.num_layers_in_last_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank": "model.virtual_pipeline_model_parallel_size",
    "micro_batch_size": "train.micro_batch_size",
    "global_batch_size": "train.global_batch_size",
    "train_iters": "train.train_iters",
    "manual_gc": "train.manual_gc",
    "manual_gc_interval": "train.manual_gc_interval",
    "seq_length": "model.seq_length",
    "ckpt_format": "checkpoint.ckpt_format",
    "use_megatron_fsdp": "dist.use_megatron_fsdp",
    "seed": "rng.seed",
    "lr": "optimizer.lr",
    "position_embedding_type": "model.position_embedding_type",
}
# Megatron-LM's policy refusals of what Bridge's own recipes run, and why they are not ported: the
# argument gets the value Megatron-LM accepts, so validate_args goes on to its later checks.
ARGS_POLICY: dict[str, tuple[Any, str]] = {
    "cross_entropy_fusion_impl": (
        "native",
        "arguments.py:1642-1647 refuses TE's fused cross entropy for stability; the Bridge perf recipes run "
        "it (cross_entropy_fusion_impl='te'); rule X006 warns",
    ),
}
# Megatron-LM refusals that read the process environment, not an argument (so ARGS_POLICY cannot
# pass them): message fragment -> why it is not a refusal of the run, and the rule that says so.
ARGS_WAIVED: dict[str, str] = {
    "optimizer cpu offload must be used in conjunction with `--use-precision-aware-optimizer`": (
        "arguments.py:1803-1807; Bridge never runs validate_args, and without the precision-aware optimizer "
        "Megatron Core keeps fp32 main-weight shards and rebuilds the offloading optimizer over them "
        "(distrib_optimizer.py:421-447, 778-781; Bridge's fix-up training/setup.py:414-420), shown in "
        "tests/megatron/test_runtime_refusals.py; FP8 parameter gather (O014) and Megatron FSDP (O010) are rules"
    ),
    "require setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1": (
        "arguments.py:1411-1439 wants it below Blackwell with TP/CP > 1; Bridge's H100 perf recipes set 32 "
        "and Bridge runs it; rule B001 warns"
    ),
}
# Sections whose fields carry Megatron-LM's argument names one to one (its
# core_transformer_config_from_args and DDP/optimizer builders read args by field name).
ARGS_SECTIONS = ("model", "ddp", "optimizer")
# Arguments set from the config that Megatron-LM's own parser would never hold as they are: what
# validate_args then does with them is not a statement about the run.
ARGS_NOT_MAPPED: dict[str, str] = {
    "pipeline_model_parallel_layout": "Bridge passes a layout object, MLM parses a string",
    "init_method": "a callable in Bridge, absent from MLM's arguments",
    "output_layer_init_method": "a callable in Bridge",
    "activation_func": "a callable in Bridge, MLM derives it from --swiglu and friends",
    "timers": "a runtime object",
    "finalize_model_grads_func": "a runtime object",
    "grad_scale_func": "a runtime object",
    "no_sync_func": "a runtime object",
    "grad_sync_func": "a runtime object",
    "param_sync_func": "a runtime object",
    "vocab_size": "MLM sizes it from the tokenizer (Bridge: tokenizer.vocab_size)",
    "pipeline_dtype": "a torch dtype in Bridge, derived from --bf16 in MLM",
    "params_dtype": "a torch dtype in Bridge, derived from --bf16 in MLM",
    "cuda_graph_scope": "deprecated alias; MLM normalises cuda_graph_modules from strings itself",
}


def _parser() -> argparse.ArgumentParser:
    from megatron.training.arguments import add_megatron_arguments

    return add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))


_DEFAULTS: list[argparse.Namespace] = []


def default_args() -> argparse.Namespace:
    """Megatron-LM's arguments at their defaults (parsed once per process)."""
    if not _DEFAULTS:
        _DEFAULTS.append(_parser().parse_args([]))
    return argparse.Namespace(**vars(_DEFAULTS[0]))


def _get(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def training_args(cfg: Any, spec: RunSpec) -> argparse.Namespace:
    """Megatron-LM's arguments for this configuration: every argument named like a field of
    ARGS_SECTIONS, the renamed ones of ARGS_FROM_CONFIG, the job's world size."""
    import torch

    args = default_args()
    names = set(vars(args))
    for section in ARGS_SECTIONS:
        obj = getattr(cfg, section)
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            # None is the config's "unset": the argument keeps Megatron-LM's default for it.
            if f.name in names and f.name not in ARGS_NOT_MAPPED and value is not None:
                setattr(args, f.name, value)
    for name, dotted in ARGS_FROM_CONFIG.items():
        with contextlib.suppress(AttributeError):
            setattr(args, name, _get(cfg, dotted))
    for name, (accepted, _why) in ARGS_POLICY.items():
        if getattr(args, name) != accepted:
            setattr(args, name, accepted)
    args.world_size, args.rank = spec.layout.world_size, 0
    args.padded_vocab_size = cfg.tokenizer.vocab_size
    args.bf16 = cfg.model.params_dtype == torch.bfloat16
    args.fp16 = cfg.model.params_dtype == torch.float16
    args.max_position_embeddings = max(args.max_position_embeddings or 0, args.seq_length or 0)
    # Megatron FSDP turns gradient-reduce overlap on when it wraps the model, whatever the config
    # says (megatron_fsdp/megatron_fsdp.py:327-336; rule O001); validate_args reads the pre-wrap value.
    if args.use_megatron_fsdp and getattr(cfg.ddp, "data_parallel_sharding_strategy", None) in (
        "optim_grads",
        "optim_grads_params",
    ):
        args.overlap_grad_reduce = True
    return args


def _args(cfg: Any, spec: RunSpec) -> None:
    from megatron.training.arguments import validate_args

    try:
        validate_args(training_args(cfg, spec))
    except AssertionError as exc:
        if not any(fragment in str(exc) for fragment in ARGS_WAIVED):
            raise


# --- running them -------------------------------------------------------------------------------

CHECKS: tuple[tuple[Check, Callable[[Any, RunSpec], None]], ...] = (
    (Check.vision, _vision),
    (Check.te_recipe, _te_recipe),
    (Check.userbuffers, _userbuffers),
    (Check.router, _router),
    (Check.moe, _moe),
    (Check.args, _args),
)


def check_config(
    cfg: Any, spec: RunSpec, *, planned: bool = True, owned: bool = False
) -> list[LibraryFinding]:
    """Every library check on `cfg` (THE table applied; not modified unless `owned`: the caller's
    own copy, which Bridge's runtime update then changes in place). Bridge's runtime update first:
    the others judge the configuration it leaves, so they run only when it accepts."""
    update = runtime_update(cfg, spec, planned=planned, in_place=owned)
    if isinstance(update.exception, ImportError):  # a package this run imports is not installed here
        return [_exception(Check.stack, update.exception)]
    if update.exception is not None:
        return [_exception(Check.bridge, update.exception)]
    from megatron.bridge.training.config import apply_environment_variables

    findings = []
    # As the rank runs them: the job's world and GPU, the recipe's env_vars by setdefault (Bridge's).
    with rank_environment(spec, set(cfg.env_vars), planned), cpu_device(), _quiet():
        apply_environment_variables(update.config)
        for check, run in CHECKS:
            try:
                run(update.config, spec)
            except Exception as exc:  # the library's refusal is the finding
                findings.append(_exception(check, exc))
    return findings


# stack_problem() once it said None: the stack imported in this process and stays imported.
_STACK_IMPORTED: list[bool] = []


def check_point(spec: RunSpec) -> list[LibraryFinding]:
    """Build this point's configuration offline (the recipe once per process, config_from_base)
    and run every check; one LIB-STACK finding when the stack does not import here."""
    if not _STACK_IMPORTED:
        problem = stack_problem()
        if problem is not None:
            return [LibraryFinding(Check.stack, f"the library checks did not run: {problem}")]
        _STACK_IMPORTED.append(True)
    with _quiet():
        cfg = config_from_base(spec)
    return check_config(cfg, spec, owned=True)
