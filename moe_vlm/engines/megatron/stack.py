"""The Megatron stack a run imports, declared once: which modules these options need, and
whether each one imports here, at which version.

`required(spec)` is the list (cheap: no import). `probe(spec)` imports each entry (seconds: it
loads Megatron); `dry_run=true` prints it (moe_vlm/run/plan.py) and `launch()` checks it on every
rank before distributed init (`stack_problem(spec)`), so a missing piece costs one line and exit
status 2, not a crash after the queue wait.
"""

from __future__ import annotations

import functools
import importlib
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from moe_vlm.config.arch import profile
from moe_vlm.config.schema import DataKind, ExperimentLogger, FlexBackend, TokenDispatcher
from moe_vlm.knobs.bridge_fields import forward_step_path
from moe_vlm.knobs.bridge_recipe import select_recipe
from moe_vlm.knobs.telemetry_fields import tensorboard_dir

if TYPE_CHECKING:
    from moe_vlm.config.spec import RunSpec

PINNED = {"megatron-core": "0.19.2", "megatron-bridge": "0.6.2"}
# megatron/core/dist_checkpointing/strategies/nvrx.py:15 (NVRX_MIN_VERSION), asserted at :45-46 when
# strategies/torch.py:64 is imported, which `pretrain`'s import chain does.
NVRX_MIN_VERSION = "0.6.0"
INSTALL_HINT = (
    "install the pinned stack with `bash scripts/install_megatron.sh` (CPU machines) or run inside "
    "NVIDIA's NeMo container (see docs/megatron.md, 'Cluster install')"
)
_CONTAINER = "NVIDIA's NeMo container ships it built for the GPU (docs/megatron.md, 'Cluster install')"
_NO_DEEP_EP_WHEEL = (
    "no wheel installs it from PyPI (deep-ep 1.0.0 there is a Hopper-only source snapshot without HybridEP "
    "that needs CUDA and NVSHMEM to build): use NVIDIA's NeMo container, or build DeepEP in your image"
)


@dataclass(frozen=True)
class StackModule:
    """One import the run makes: `from module import name` for each of `imports` ("module:name")."""

    label: str  # what it is, for people
    imports: tuple[str, ...]
    distribution: str  # the pip distribution whose version is reported
    why: str  # the option (or the library file:line) that imports it
    fix: str
    minimum: str | None = None  # the lowest version the library accepts
    pinned: str | None = None  # the version the engine's table is checked against

    def statement(self) -> str:
        return "; ".join(_statement(target) for target in self.imports)


def _statement(target: str) -> str:
    module, _, name = target.partition(":")
    return f"from {module} import {name}" if name else f"import {module}"


CORE = StackModule(
    "Megatron Core",
    ("megatron.core",),
    "megatron-core",
    "every engine=megatron run",
    INSTALL_HINT,
    pinned=PINNED["megatron-core"],
)
TRANSFORMER_ENGINE = StackModule(
    "Transformer Engine",
    ("transformer_engine.pytorch",),
    "transformer-engine",
    "`import megatron.bridge` imports it (megatron/bridge/peft/lora_layers.py:20), as does the Qwen3-VL "
    "model (megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py:19)",
    f"{_CONTAINER}; on a CPU machine `bash scripts/install_megatron.sh` builds it from source",
)
BRIDGE = StackModule(
    "Megatron Bridge",
    ("megatron.bridge",),
    "megatron-bridge",
    "every engine=megatron run",
    INSTALL_HINT,
    pinned=PINNED["megatron-bridge"],
)
# The stack the configuration is built against: tests/megatron and build_config need only these.
LIBRARY = (CORE, TRANSFORMER_ENGINE, BRIDGE)

RESILIENCY = StackModule(
    "NVIDIA Resiliency Extension",
    ("nvidia_resiliency_ext.inprocess:CallWrapper",),
    "nvidia-resiliency-ext",
    "megatron/bridge/training/pretrain.py:19 imports it unconditionally",
    f"`pip install 'nvidia-resiliency-ext>={NVRX_MIN_VERSION}'` (its wheels need glibc 2.39; "
    "`bash scripts/install_megatron.sh` installs the same wheel on older glibc)",
    minimum=NVRX_MIN_VERSION,
)
PRETRAIN = StackModule(
    "Bridge pretrain",
    ("megatron.bridge.training.pretrain:pretrain",),
    "megatron-bridge",
    "the training loop",
    INSTALL_HINT,
)


def forward_step_module(path: str) -> StackModule:
    return StackModule(
        "forward step",
        (path,),
        "megatron-bridge",
        "the forward step the engine wraps (data.packing=in_batch: vlm_step)",
        INSTALL_HINT,
    )


PROCESSOR = StackModule(
    "HF processor",
    ("transformers:AutoProcessor", "transformers:Qwen3VLProcessor"),
    "transformers",
    "the data pipeline (AutoProcessor resolves both Qwen3-VL and Qwen3.5 to Qwen3VLProcessor)",
    "`pip install 'transformers>=5.8,<=5.12.1' torchvision`",
)
ENERGON = StackModule(
    "Megatron Energon",
    ("megatron.energon",),
    "megatron-energon",
    "data=real (Bridge's Energon loader)",
    "`pip install 'megatron-energon~=7.0'`",
)
DEEP_EP = StackModule(
    "DeepEP",
    ("deep_ep:Buffer",),
    "deep_ep",
    "dispatcher=deepep (megatron/core/transformer/moe/fused_a2a.py:11, token_dispatcher.py:1273-1277)",
    f"{_NO_DEEP_EP_WHEEL}; or dispatcher=alltoall",
)
HYBRID_EP = StackModule(
    "HybridEP (DeepEP)",
    ("deep_ep:HybridEPBuffer",),
    "deep_ep",
    "dispatcher=hybridep (megatron/core/transformer/moe/fused_a2a.py:271, token_dispatcher.py:1047-1051)",
    f"{_NO_DEEP_EP_WHEEL} (DeepEP's hybrid-ep branch); or dispatcher=alltoall",
)
FLA = StackModule(
    "flash-linear-attention",
    (
        "fla.modules.convolution:causal_conv1d",
        "fla.modules.l2norm:l2norm",
        "fla.ops.gated_delta_rule:chunk_gated_delta_rule",
    ),
    "flash-linear-attention",
    "Qwen3.5's Gated DeltaNet layers (megatron/core/ssm/gated_delta_net/common.py:43-55, 141-145)",
    "`pip install flash-linear-attention` (pure Python; `bash scripts/install_megatron.sh` installs "
    "the version megatron-core pins)",
)

# data=bridge_mock: Bridge's Qwen-VL collate stops without it (models/qwen_vl/data/collate_fn.py:111-112).
QWEN_VL_UTILS = StackModule(
    "qwen-vl-utils",
    ("qwen_vl_utils:process_vision_info",),
    "qwen-vl-utils",
    "data=bridge_mock: Bridge's Qwen-VL collate resizes the mock's images with it (collate_fn.py:139-140)",
    "`pip install qwen-vl-utils`, or data=synthetic",
)

# Experiment trackers Bridge imports when the logger group turns one on.
TENSORBOARD = StackModule(
    "TensorBoard",
    ("torch.utils.tensorboard.writer:SummaryWriter",),
    "tensorboard",
    "logger=tensorboard or profiling=torch: Bridge's writer (megatron/bridge/training/state.py:181-187)",
    "`pip install tensorboard`, or logger=none",
)
WANDB = StackModule(
    "Weights & Biases",
    ("wandb",),
    "wandb",
    "logger=wandb: Bridge's tracker (megatron/bridge/training/state.py:197-221)",
    "`pip install wandb` in the job environment, or logger=tensorboard",
)
MLFLOW = StackModule(
    "MLflow",
    ("mlflow",),
    "mlflow",
    "logger=mlflow: Bridge's config check imports it (megatron/bridge/training/config.py:699-708)",
    "`pip install mlflow` in the job environment, or logger=tensorboard",
)


def required(spec: RunSpec) -> list[StackModule]:
    """Every module a run with these options imports, in import order (no import here)."""
    modules = [*LIBRARY, RESILIENCY, PRETRAIN, forward_step_module(forward_step_path(spec))]
    recipe = select_recipe(spec)
    if recipe is not None:
        modules.append(
            StackModule(
                "Bridge recipe",
                (f"{recipe.module}:{recipe.function}",),
                "megatron-bridge",
                f"model={spec.model.name} cluster={spec.cluster.name} ({recipe.kind} recipe)",
                f"the recipe table in moe_vlm/knobs/bridge_fields.py targets megatron-bridge "
                f"{PINNED['megatron-bridge']}; {INSTALL_HINT}",
            )
        )
    modules.append(PROCESSOR)
    if spec.data.kind == DataKind.real:
        modules.append(ENERGON)
    if spec.data.kind == DataKind.bridge_mock:
        modules.append(QWEN_VL_UTILS)
    if spec.dispatcher.token_dispatcher == TokenDispatcher.flex:
        if spec.dispatcher.backend == FlexBackend.deepep:
            modules.append(DEEP_EP)
        elif spec.dispatcher.backend == FlexBackend.hybridep:
            modules.append(HYBRID_EP)
    if profile(spec.model.arch).linear_attention:
        modules.append(FLA)
    if tensorboard_dir(spec) is not None:
        modules.append(TENSORBOARD)
    trackers = {ExperimentLogger.wandb: WANDB, ExperimentLogger.mlflow: MLFLOW}
    if spec.logger.backend in trackers:
        modules.append(trackers[spec.logger.backend])
    return modules


@dataclass(frozen=True)
class Probe:
    """One module, tried here."""

    module: StackModule
    version: str | None
    error: str | None  # None: it imports and its version is accepted; the same for one cause
    where: str = ""  # " at <library file>:<line>" that raised it, when a library line did

    @property
    def ok(self) -> bool:
        return self.error is None

    def lines(self, detail: bool = True) -> list[str]:
        """The plan's lines: status, version, import; for a failure why and the fix (once per cause)."""
        status = "ok" if self.ok else "MISSING"
        head = f"  {status:<8}{self.module.label:<28}{self.version or '-':<12}{self.module.statement()}"
        if self.ok:
            return [head]
        if not detail:
            return [f"{head}", f"{'':<10}{self.error}{self.where} (same cause as above)"]
        return [head, f"{'':<10}{self.error}{self.where}; why: {self.module.why}; fix: {self.module.fix}"]

    def problem(self) -> str:
        """One clause naming the module, why it failed and the fix."""
        return f"{self.module.statement()} fails here ({self.error}{self.where}); why: {self.module.why}; fix: {self.module.fix}"


def distribution_version(name: str) -> str | None:
    import importlib.metadata  # a tenth of a CPU dry run's own start-up; only a stack probe asks

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _import_error(target: str) -> tuple[str, str] | None:
    """Why `target` ("module:name") does not import here, and where; None when it does. Cached."""
    module_name, _, name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        if name:
            getattr(module, name)
    except ModuleNotFoundError as exc:
        return f"No module named '{exc.name}'", where_raised(exc)
    # ImportError, AttributeError, and the rest: TE raises FileNotFoundError for a missing torch
    # extension, Megatron Core an AssertionError for a too-old nvidia-resiliency-ext.
    except Exception as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", where_raised(exc)
    return None


# TE loads its torch extension by file (transformer_engine/common/__init__.py:215) and raises
# FileNotFoundError when the file is not there (:154): its Python package installed, the extension
# not (an interrupted or failed `pip install`, or a build still running).
_TE_HALF = "Could not find shared object file for Transformer Engine torch lib"
TE_HALF_INSTALLED_FIX = (
    "reinstall its PyTorch extension: `bash scripts/install_megatron.sh` (rebuilds transformer-engine-torch "
    "from source on a CPU machine: pip install --no-build-isolation --no-deps transformer-engine-torch), "
    f"or on a cluster {_CONTAINER}"
)


@dataclass(frozen=True)
class HalfInstalled:
    """Transformer Engine's Python package without its torch extension: what failed, where, the fix."""

    version: str | None  # transformer-engine's, as installed
    error: str
    where: str
    fix: str = TE_HALF_INSTALLED_FIX

    def cause(self) -> str:
        return (
            f"Transformer Engine is half-installed here: transformer-engine {self.version or '(no version)'} is "
            f"present but its PyTorch extension (transformer_engine_torch) is not ({self.error}{self.where})"
        )

    def line(self) -> str:
        return f"{self.cause()}; fix: {self.fix}"


def half_installed(probes: Iterable[Probe]) -> HalfInstalled | None:
    """A half-installed Transformer Engine, when a probe failed on TE's missing torch extension
    (Megatron Core and Bridge import TE, so theirs fail on it first); None otherwise. From probes
    alone: a plan cache entry answers it without importing anything."""
    found = list(probes)
    broken = next((p for p in found if p.error is not None and _TE_HALF in p.error), None)
    if broken is None or broken.error is None:
        return None
    te = next((p for p in found if p.module.label == TRANSFORMER_ENGINE.label), None)
    version = te.version if te is not None else distribution_version(TRANSFORMER_ENGINE.distribution)
    return HalfInstalled(version, broken.error, broken.where)


def transformer_engine_problem() -> str | None:
    """One line when Transformer Engine's PyTorch side does not import here, naming the broken
    install and the fix (None when it imports). Cached with the stack probe's own import. torch first,
    as every run imports them (Megatron Core does): it loads the pip NCCL that TE's core library links,
    and a bare `import transformer_engine.pytorch` fails on libnccl.so.2 without it."""
    import torch  # noqa: F401

    found = probe_module(TRANSFORMER_ENGINE)
    if found.error is None:
        return None
    half = half_installed([found])
    if half is not None:
        return half.line()
    return (
        f"Transformer Engine does not import here ({found.error}{found.where}); fix: {TRANSFORMER_ENGINE.fix}"
    )


def where_raised(exc: BaseException) -> str:
    """Where the library line that failed is: " at <file>:<line>" (relative to site-packages)."""
    ours = ("<", __file__, str(Path(importlib.__file__).parent))  # this probe and importlib's frames
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(ours)]
    if not frames:
        return ""
    path = frames[-1].filename
    # Relative to the import root it came from (site-packages, or a directory on PYTHONPATH).
    roots = sorted((str(Path(entry).resolve()) for entry in sys.path if entry), key=len, reverse=True)
    root = next((r for r in roots if path.startswith(r.rstrip("/") + "/")), None)
    if root is not None:
        path = path[len(root.rstrip("/")) + 1 :]
    return f" at {path}:{frames[-1].lineno}"


def _version_problem(module: StackModule, version: str | None) -> str | None:
    from packaging.version import Version

    if version is None:
        return None
    if module.pinned is not None and version != module.pinned:
        return f"{module.distribution} {version} is installed, the engine is checked against {module.pinned}"
    if module.minimum is not None and Version(version) < Version(module.minimum):
        return f"{module.distribution} {version} is installed, the library needs >= {module.minimum}"
    return None


def probe_module(module: StackModule) -> Probe:
    failure = next((e for e in map(_import_error, module.imports) if e is not None), None)
    version = distribution_version(module.distribution)
    if failure is not None:
        return Probe(module, version, *failure)
    return Probe(module, version, _version_problem(module, version))


def probe(spec: RunSpec | None = None) -> list[Probe]:
    """Import every module the run needs (the library alone without a spec); seconds, once per process."""
    return [probe_module(module) for module in (required(spec) if spec is not None else LIBRARY)]


def stack_problem(spec: RunSpec | None = None) -> str | None:
    """One line: what the run would import and cannot, and the fix (None when all import).

    Without a spec, only the library the configuration is built with (tests/megatron).
    """
    failed: dict[str, Probe] = {}
    for found in probe(spec):
        # One cause (TE missing, say) fails every module that imports it: name it once.
        if not found.ok and found.error not in failed:
            failed[str(found.error)] = found
    if not failed:
        return None
    half = half_installed(failed.values())
    if half is not None:  # one cause fails them all: name the broken install, not its victims
        return half.line()
    first = next(iter(failed.values()))
    if spec is None:
        return f"the Megatron stack does not import ({first.module.label}: {first.error}{first.where}); {INSTALL_HINT}"
    named = " | ".join(p.problem() for p in failed.values())
    return f"the run would import {len(failed)} thing(s) that fail here: {named}"


def versions() -> dict[str, str | None]:
    names = (
        "megatron-core",
        "megatron-bridge",
        "transformer-engine",
        "transformer-engine-torch",
        "nvidia-resiliency-ext",
        "flash-linear-attention",
        "deep_ep",
    )
    return {name: distribution_version(name) for name in names}
