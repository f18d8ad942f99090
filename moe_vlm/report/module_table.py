"""A PyTorch profiler trace -> time per model part: the vision encoder, the projector, the decoder,
and inside the decoder attention, router, dispatch/combine and expert GEMMs.

The field guide asks for this before blaming the dispatcher. Both engines' traces carry Python
call stacks (the torch engine's profiler and Bridge's ``pytorch_profiler_collect_callstack``), so
each ``nn.Module`` call is an event ``nn.Module: <Class>_<i>`` and each Python function
``<file>(<line>): <name>`` on the thread that ran it. A unit of time is placed by the module
classes and functions around it:

- on a CPU trace: each operator's self time (its duration less its child operators');
- on a GPU trace: each kernel, memcpy and memset, placed where its launch was made (the CUDA
  runtime call with the same correlation id).

Backward work runs outside any module call; autograd names the forward operator it belongs to
(``autograd::engine::evaluate_function: XBackward0`` carries the forward op's sequence number), so
it is placed where that operator ran. Recomputed forwards (activation checkpointing) run inside
backward and count there.

Which classes are which part (PATTERNS): transformers' Qwen3-VL-MoE (``Qwen3VLMoeVisionModel``,
``Qwen3VLMoeVisionPatchMerger``, ``Qwen3VLMoeTextModel``, ``Qwen3VLMoeTextAttention``,
``Qwen3VLMoeTextTopKRouter``, ``Qwen3VLMoeTextExperts``; FSDP2's ``FSDP<Class>`` copies read as
their class) and Megatron's (``Qwen3VLVisionModel``, ``Qwen3VLVisionPatchMerger``,
``Qwen3VLGPTModel``, ``SelfAttention``, ``TopKRouter``, ``TEGroupedMLP``/``SequentialMLP`` with
``*GroupedLinear`` GEMMs; token dispatchers are plain classes, so MoELayer's ``dispatch``,
``combine`` and ``preprocess`` and every ``token_dispatcher.py`` / ``fused_a2a.py`` function are
dispatch/combine). Inside transformers' experts, which loop over experts in Python, GEMM operators
are expert GEMMs, the activation and weighting are "experts, other", and the gathers and scatters
around them are dispatch/combine.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from moe_vlm.record.profiling import TORCH_PROFILE_DIR

VISION, PROJECTOR, DECODER = "vision_encoder", "projector", "decoder"
ATTENTION, ROUTER, DISPATCH = "decoder.attention", "decoder.router", "decoder.dispatch_combine"
EXPERT_GEMM, EXPERT_OTHER = "decoder.expert_gemm", "decoder.experts_other"
DECODER_OTHER = "decoder.other"
MODEL_OTHER, DATA_PARALLEL, OUTSIDE = "model_other", "data_parallel", "outside_model"
ROWS: dict[str, str] = {
    VISION: "vision encoder",
    PROJECTOR: "projector (patch mergers)",
    DECODER: "decoder",
    ATTENTION: "  attention",
    ROUTER: "  router",
    DISPATCH: "  dispatch / combine",
    EXPERT_GEMM: "  expert GEMMs",
    EXPERT_OTHER: "  experts, other (activation, weighting)",
    DECODER_OTHER: "  decoder, other (embedding, norms, LM head)",
    MODEL_OTHER: "model, other (loss, image-token glue)",
    DATA_PARALLEL: "data-parallel sharding (FSDP gathers, gradient reduction)",
    OUTSIDE: "outside the model (optimizer, data)",
}
DECODER_PARTS = (ATTENTION, ROUTER, DISPATCH, EXPERT_GEMM, EXPERT_OTHER, DECODER_OTHER)

# Module classes by role (re.search on the class name, FSDP prefix removed).
PATTERNS: dict[str, re.Pattern[str]] = {
    "projector": re.compile(r"PatchMerger$|MultimodalProjector$"),
    "vision": re.compile(r"VisionModel$"),
    "decoder": re.compile(r"TextModel$|GPTModel$"),
    "model": re.compile(r"ForConditionalGeneration$|^Qwen3\w*Model$"),
    "attention": re.compile(r"TextAttention$|SelfAttention$|GatedDeltaNet$"),
    "router": re.compile(r"TopKRouter$"),
    "experts": re.compile(r"TextExperts$|GroupedMLP$|SequentialMLP$"),
    "gemm_module": re.compile(r"GroupedLinear$"),
}
# Python functions that move tokens to and from their experts (Megatron's dispatchers are no modules).
DISPATCH_FUNCTIONS = re.compile(
    r"moe/token_dispatcher\.py\(\d+\): |moe/fused_a2a\.py\(\d+\): |moe/moe_layer\.py\(\d+\): (dispatch|combine|preprocess)$"
)
# FSDP / DDP machinery wherever it runs (parameter gathers in pre-forward hooks, gradient reduction in
# post-backward): FSDP2's record_function labels and autograd node, both engines' Python functions.
DATA_PARALLEL_EVENTS = re.compile(
    r"^FSDP::|RegisterPostBackwardFunctionBackward$|torch/distributed/fsdp/|megatron/core/distributed/"
)
GEMM_OPS = re.compile(
    r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|_grouped_mm|_scaled_mm|_scaled_grouped_mm)$"
    r"|^(Mm|Addmm|Bmm|Baddbmm|GroupedMm|ScaledMm)Backward"
)
ACTIVATION_OPS = re.compile(
    r"^aten::(silu|gelu|sigmoid|mul|mul_|relu|swiglu)$|^(Silu|Gelu|Sigmoid|Mul|Relu)Backward"
)
COMM = re.compile(r"^(c10d::|nccl:|gloo:|record_param_comms)|^nccl|Nccl|AllToAll|AllGather|ReduceScatter")
MODULE_EVENT = re.compile(r"^nn\.Module: (\w+?)_\d+$")
BACKWARD_OP = "autograd::engine::evaluate_function: "
STEP_EVENT = re.compile(r"^ProfilerStep#\d+$")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass(frozen=True)
class Context:
    """Where a unit of time ran: module classes (outer to inner), tags, and the operator kinds."""

    modules: tuple[str, ...] = ()
    dispatch: bool = False  # inside a dispatch/combine function
    data_parallel: bool = False  # inside FSDP / DDP machinery
    backward: bool = False
    gemm: bool = False
    activation: bool = False
    comm: bool = False


@dataclass
class ModuleTable:
    steps: int
    unit: str  # "cpu_op_self" or "gpu_kernel"
    forward_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    backward_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    comm_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def total_s(self, row: str) -> float:
        if row == DECODER:
            return sum(self.total_s(part) for part in DECODER_PARTS)
        return self.forward_s.get(row, 0.0) + self.backward_s.get(row, 0.0)

    def per_step_ms(self, row: str) -> dict[str, float]:
        parts = DECODER_PARTS if row == DECODER else (row,)
        scale = 1000.0 / max(self.steps, 1)
        return {
            "forward": sum(self.forward_s.get(p, 0.0) for p in parts) * scale,
            "backward": sum(self.backward_s.get(p, 0.0) for p in parts) * scale,
            "total": sum(self.total_s(p) for p in parts) * scale,
            "comm": sum(self.comm_s.get(p, 0.0) for p in parts) * scale,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "unit": self.unit, "rows": {row: self.per_step_ms(row) for row in ROWS}}


def _class_name(event_name: str) -> str | None:
    match = MODULE_EVENT.match(event_name)
    return match.group(1).removeprefix("FSDP") if match else None


def classify(context: Context) -> str:
    """The table row a unit of time belongs to."""
    modules = context.modules
    if context.data_parallel:
        return DATA_PARALLEL

    def has(role: str) -> bool:
        return any(PATTERNS[role].search(name) for name in modules)

    if has("projector"):
        return PROJECTOR
    if has("vision"):
        return VISION
    # transformers calls the LM head (a Linear) straight from the top model's forward.
    lm_head = len(modules) >= 2 and PATTERNS["model"].search(modules[-2]) and modules[-1] == "Linear"
    if not has("decoder") and not lm_head:
        return MODEL_OTHER if has("model") else OUTSIDE
    if context.dispatch:
        return DISPATCH
    if has("router"):
        return ROUTER
    if has("experts"):
        if context.gemm or has("gemm_module"):
            return EXPERT_GEMM
        # Megatron's experts are GEMMs and their activation; transformers' loop also gathers and scatters.
        return EXPERT_OTHER if context.activation or not has_hf_experts(modules) else DISPATCH
    if has("attention"):
        return ATTENTION
    return DECODER_OTHER


def has_hf_experts(modules: tuple[str, ...]) -> bool:
    return any(name.endswith("TextExperts") for name in modules)


@dataclass
class _Frame:
    end: float
    context: Context
    op: bool  # a CPU operator (its children's time is not its own)
    duration: float = 0.0
    children: float = 0.0


def load_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as handle:
        trace: dict[str, Any] = json.load(handle)
    return trace


def module_table(trace: Mapping[str, Any]) -> ModuleTable:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    step_spans = [e for e in events if STEP_EVENT.match(str(e.get("name", "")))]
    steps = len({e["name"] for e in step_spans})
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    table = ModuleTable(steps=steps, unit="gpu_kernel" if gpu else "cpu_op_self")
    if step_spans:
        start = min(float(e["ts"]) for e in step_spans)
        stop = max(float(e["ts"]) + float(e["dur"]) for e in step_spans)
        events = [e for e in events if start <= float(e["ts"]) <= stop or e.get("cat") in GPU_CATEGORIES]
    host = sorted(
        (e for e in events if e.get("cat") not in GPU_CATEGORIES),
        key=lambda e: (float(e["ts"]), -float(e["dur"])),
    )
    launches = _walk(host, table, count_ops=not gpu)
    for kernel in gpu:
        context = launches.get((kernel.get("pid"), (kernel.get("args") or {}).get("correlation")))
        context = context or Context()
        if COMM.search(str(kernel.get("name", ""))):
            context = replace(context, comm=True)
        _add(table, context, float(kernel["dur"]) / 1e6)
    return table


def _walk(host: list[dict[str, Any]], table: ModuleTable, count_ops: bool) -> dict[tuple[Any, Any], Context]:
    """One pass over the host events in time order, a stack per thread. Charges each operator's
    self time (CPU traces) and returns the context of each CUDA launch by correlation id."""
    stacks: dict[tuple[Any, Any], list[_Frame]] = defaultdict(list)
    forward: dict[tuple[Any, Any], Context] = {}  # (pid, sequence number) -> the forward op's context
    launches: dict[tuple[Any, Any], Context] = {}

    def pop(stack: list[_Frame], until: float) -> None:
        while stack and stack[-1].end <= until:
            frame = stack.pop()
            if frame.op and count_ops:
                _add(table, frame.context, max(frame.duration - frame.children, 0.0) / 1e6)

    for event in host:
        ts, dur = float(event["ts"]), float(event["dur"])
        stack = stacks[(event.get("pid"), event.get("tid"))]
        pop(stack, ts)
        context = stack[-1].context if stack else Context()
        name, category = str(event.get("name", "")), event.get("cat")
        args = event.get("args") or {}
        is_op = category == "cpu_op"
        if DATA_PARALLEL_EVENTS.search(name) and category in ("python_function", "user_annotation", "cpu_op"):
            context = replace(context, data_parallel=True)
        if category == "python_function":
            module = _class_name(name)
            if module is not None:
                context = replace(context, modules=(*context.modules, module))
            elif DISPATCH_FUNCTIONS.search(name):
                context = replace(context, dispatch=True)
        elif is_op:
            sequence = args.get("Sequence number")
            if name.startswith(BACKWARD_OP):
                # Backward runs outside the module calls: place it where its forward op ran.
                linked = forward.get((event.get("pid"), sequence)) or Context()
                node = name.removeprefix(BACKWARD_OP)
                context = _with_op(replace(linked, backward=True), node)
                if DATA_PARALLEL_EVENTS.search(node):
                    context = replace(context, data_parallel=True)
            else:
                context = _with_op(context, name)
                if sequence is not None and not context.backward:
                    # Every op records the counter as it starts; the node takes it when its op creates
                    # it, so the last op (in time) with a number is that op or one of its children.
                    forward[(event.get("pid"), sequence)] = context
            parent = next((f for f in reversed(stack) if f.op), None)
            if parent is not None:
                parent.children += dur
        elif category in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[(event.get("pid"), args["correlation"])] = context
        stack.append(_Frame(ts + dur, context, is_op, dur))
    for stack in stacks.values():
        pop(stack, float("inf"))
    return launches


def _with_op(context: Context, op: str) -> Context:
    return replace(
        context,
        gemm=context.gemm or bool(GEMM_OPS.search(op)),
        activation=context.activation or bool(ACTIVATION_OPS.search(op)),
        comm=context.comm or bool(COMM.search(op)),
    )


def _add(table: ModuleTable, context: Context, seconds: float) -> None:
    row = classify(context)
    (table.backward_s if context.backward else table.forward_s)[row] += seconds
    if context.comm:
        table.comm_s[row] += seconds


# --- files and the report ----------------------------------------------------------------------


def traces(run_dir: Path) -> list[Path]:
    """The run's PyTorch profiler traces, one per profiled rank, lowest rank first."""
    found = list((run_dir / TORCH_PROFILE_DIR).glob("rank-*.json*"))
    return sorted(found, key=lambda p: int(re.sub(r"\D", "", p.name.split(".")[0]) or 0))


def table_of(trace_path: Path) -> ModuleTable:
    return module_table(load_trace(trace_path))


def markdown(table: ModuleTable) -> str:
    unit = "GPU kernel time" if table.unit == "gpu_kernel" else "CPU operator self time"
    grand = sum(table.per_step_ms(row)["total"] for row in ROWS if row != DECODER)
    lines = [
        "| part | forward ms/step | backward ms/step | total ms/step | share | of which communication ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row, label in ROWS.items():
        ms = table.per_step_ms(row)
        share = f"{100 * ms['total'] / grand:.1f}%" if grand > 0 else "-"
        lines.append(
            f"| {label} | {ms['forward']:.2f} | {ms['backward']:.2f} | {ms['total']:.2f} | {share} | "
            f"{ms['comm']:.2f} |"
        )
    return "\n".join([*lines, "", f"({unit}, mean over {table.steps} profiled step(s))"])


def section(rows: Iterable[Mapping[str, Any]], top: int) -> list[str]:
    """report.md's per-module section: one table per run with a trace (its lowest profiled rank)."""
    found = [(str(row["run_dir"]), paths) for row in rows if (paths := traces(Path(str(row["run_dir"]))))]
    if not found:
        return []
    lines = [
        "",
        "## Per-module time (profiling=torch)",
        "",
        "From each run's PyTorch profiler trace (the lowest profiled rank; moe_vlm/report/module_table.py). "
        "Read it before blaming the dispatcher: dispatch / combine against expert GEMMs and attention.",
    ]
    for run_dir, paths in found[:top]:
        lines += ["", f"### {run_dir} ({paths[0].name}; {len(paths)} rank trace(s))", ""]
        try:
            lines.append(markdown(table_of(paths[0])))
        except (OSError, ValueError) as exc:
            lines.append(f"(unreadable trace: {type(exc).__name__}: {exc})")
    if len(found) > top:
        lines += ["", f"+ {len(found) - top} more profiled run(s) not shown; more with --top N."]
    return lines


def main(argv: list[str] | None = None) -> int:
    """``python -m moe_vlm.report.module_table RUN_DIR|TRACE``: print the table."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m moe_vlm.report.module_table RUN_DIR|TRACE.json[.gz]", file=sys.stderr)
        return 2
    path = Path(args[0])
    found = traces(path) if path.is_dir() else [path] if path.is_file() else []
    if not found:
        print(
            f"moe_vlm.report.module_table: error: {path}: no PyTorch trace ({TORCH_PROFILE_DIR}/rank-*.json.gz). "
            "Fix: pass a run directory of a profiling=torch run, or a trace file.",
            file=sys.stderr,
        )
        return 2
    for trace_path in found:
        print(f"## {trace_path}\n\n{markdown(table_of(trace_path))}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
