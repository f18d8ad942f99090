"""Per-platform playbooks: the sister skills' hardware advice for the cluster a run targets.

Source: ../shared/reference/sister-skills.md (2.2 per-hardware recommendations, 2.3 environment
variables, 3 facts that refine the VLM skill), which paraphrases the Megatron-Bridge skills; each
line names its skill and file (`<skill>/<file>`, "[main]" for the evidence-gated rewrite), or
the installed library file:line ("(code)").

A piece of advice that can be a command is one: its overrides go on top of the starting
configuration the advisor settled (or the 3D candidate), every point of it (a sweep axis is
`key=a,b`) is composed and validated here, and it is printed only when no point has an error
finding; otherwise the advice is printed as text with the rule that stands in its way.
Precision advice is an A/B sweep of `precision=` (conf/precision: Bridge's mixed-precision recipes).
The CUDA-graph scope a model's playbook recommends (`graph_scope`) is also the scope the
advisor's peak-throughput start uses: one fact for both.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from enum import Enum

from moe_vlm.config.arch import profile
from moe_vlm.config.compose import compose_spec, set_overrides
from moe_vlm.config.schema import Arch, Engine, FlexBackend
from moe_vlm.config.spec import RunSpec, hybridep_topology
from moe_vlm.knobs.bridge_recipe import select_recipe
from moe_vlm.rules import errors, validate

SKILLS = "sister-skills.md"
HW = "hardware-configs/card.yaml [main]"
DISPATCH = "dispatcher-selection/SKILL.md"
WORKFLOW = "moe-optimization-workflow/SKILL.md"
GRAPHS = "cuda-graphs/SKILL.md"
CARD = "moe-vlm-training/card.yaml"
QWEN3_VL_GRAPHS = "code: megatron/bridge/perf_recipes/qwen_vl/common.py:88-98 _finalize_qwen3_vl"
QWEN35_GRAPHS = "code: megatron/bridge/perf_recipes/qwen_vl/common.py:71-79 _qwen35_vl_post"
APPLY_ENV = "megatron/bridge/training/config.py:1832-1850"
CODE = "code: "  # the installed library's source, file:line


class Topic(Enum):
    dispatcher = "dispatcher"
    precision = "precision"
    graphs = "CUDA graphs"
    host = "host"
    setup = "setup"
    measure = "measurement"


@dataclass(frozen=True)
class Advice:
    topic: Topic
    text: str
    source: str
    changes: tuple[str, ...] = ()  # overrides on the start; `key=a,b` is a sweep axis (printed with -m)


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    why: str
    source: str
    # Whose perf recipes set it: None every installed one (perf_recipes/qwen_vl/*/*.py), else the
    # GPUs named (frozenset(): none). tests/megatron reads the recipes' env_vars to check it.
    set_by: frozenset[str] | None = None


@dataclass(frozen=True)
class Playbook:
    platform: str
    advice: tuple[Advice, ...]
    env: tuple[EnvVar, ...]
    note: str = ""


_PRECISION_NOTE = (
    "precision= selects Bridge's mixed-precision recipe, as its *_fp8cs_config / *_fp8mx_config perf "
    "recipes set it; FP8 for VLM MoE is not validated upstream (rule P002 warns): A/B it against BF16 on "
    "absolute throughput and compare loss curves (MFU is given against the BF16 and the format's peak)"
)

# Process settings the perf recipes put in cfg.env_vars (Bridge applies them on each rank), and
# one they do not.
_COMMON_ENV = (
    EnvVar("TORCH_NCCL_HIGH_PRIORITY", "1", "NCCL on its high-priority stream",
           f"{CODE}megatron/bridge/perf_recipes/environment.py:22-26"),
    EnvVar("CUDA_DEVICE_MAX_CONNECTIONS", "32", "the perf recipes' value (EP overlap + CUDA graphs); 1 is "
           "the default", "hardware-configs/SKILL.md; tp-dp-comm-overlap/SKILL.md"),
    EnvVar("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True",
           "the first OOM fix, at no throughput cost", "memory-tuning/SKILL.md"),
    EnvVar("NCCL_GRAPH_REGISTER", "0", "required with CUDA graphs and expandable segments", GRAPHS),
    EnvVar("TORCH_NCCL_AVOID_RECORD_STREAMS", "1", "", "multi-node-slurm/SKILL.md [side]; perf recipes"),
    EnvVar("NCCL_NVLS_ENABLE", "0", "", "multi-node-slurm/references/templates.md; perf recipes"),
    EnvVar("NVTE_FWD_LAYERNORM_SM_MARGIN", "20", "SMs left to overlapped communication",
           "tp-dp-comm-overlap/SKILL.md; perf recipes"),
    EnvVar("NVTE_BWD_LAYERNORM_SM_MARGIN", "20", "", "tp-dp-comm-overlap/SKILL.md; perf recipes"),
    EnvVar("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1", "", "memory-tuning/SKILL.md; Slurm template",
           set_by=frozenset()),
)  # fmt: skip

_HOPPER = Playbook(
    "H100",
    (
        Advice(Topic.dispatcher, "A/B DeepEP and HybridEP: HybridEP won the canonical Qwen3-30B 16xH100 "
               "shape; the Qwen3-235B 256xH100 recipe uses alltoall with EP overlap, which Qwen3VLModel "
               "cannot run here (rule D008)", f"{HW}; {DISPATCH}", ("dispatcher=deepep,hybridep",)),
        Advice(Topic.precision, "BF16 first; on Hopper the FP8 recipes are per-tensor delayed, current "
               "scaling and blockwise (this tool runs current scaling, precision=fp8cs); keep the router in "
               "FP32; " + _PRECISION_NOTE, f"{HW}; {WORKFLOW}", ("precision=bf16,fp8cs",)),
    ),
    _COMMON_ENV,
)  # fmt: skip

_B200 = Playbook(
    "B200",
    (
        Advice(Topic.dispatcher, "DeepEP or HybridEP where the runtime supports them: A/B them against "
               "the alltoall bring-up", f"{HW}; {DISPATCH}", ("dispatcher=alltoall,deepep,hybridep",)),
        Advice(Topic.setup, "focus on container quality and the PP layout", HW),
        Advice(Topic.precision, "BF16 until stable, then MXFP8 (Blackwell); " + _PRECISION_NOTE,
               f"{HW}; {WORKFLOW}", ("precision=bf16,fp8mx",)),
    ),
    _COMMON_ENV,
)  # fmt: skip


def _grace_blackwell(platform: str, extra: tuple[Advice, ...]) -> Playbook:
    return Playbook(
        platform,
        (
            Advice(Topic.dispatcher, "HybridEP first; DeepEP cannot run on GB200/GB300 (Bridge checks the "
                   "device name, training/flex_dispatcher_backend.py:108; rule D001). [main] still starts "
                   "bring-up on alltoall and treats HybridEP as the first A/B (sweep=dispatcher_ab)",
                   f"{HW}; {DISPATCH}", ("dispatcher=hybridep",)),
            Advice(Topic.dispatcher, "sweep HybridEP's SM count 16-32 (moe_hybridep_num_sms defaults to "
                   "16; the harness uses 32)", DISPATCH, ("dispatcher=hybridep", "dispatcher.num_sms=16,24,32")),
            Advice(Topic.dispatcher, "the perf recipes combine in 128-token chunks "
                   "(NUM_OF_TOKENS_PER_CHUNK_COMBINE_API=128; the 16xH100 HybridEP row used 64); this tool "
                   "leaves it to HybridEP unless asked", f"{SKILLS} 2.3; {HW}",
                   ("dispatcher=hybridep", "dispatcher.hybridep_tokens_per_chunk_combine=128")),
            Advice(Topic.host, "CPU affinity and host cleanup can matter almost as much as a dispatcher "
                   "swap: check the straggler section of `moe-vlm report` before tuning", HW),
            Advice(Topic.graphs, "add CUDA graphs only when a profile shows host overhead", HW),
            Advice(Topic.precision, "BF16 until stable, then MXFP8 (the GB200/GB300 DSV3 rows are FP8-MX); "
                   + _PRECISION_NOTE, f"{HW}; {WORKFLOW}", ("precision=bf16,fp8mx",)),
            *extra,
        ),
        _COMMON_ENV,
    )  # fmt: skip


PLAYBOOKS: dict[str, Playbook] = {
    "h100": _HOPPER,
    "h200": Playbook("H200", _HOPPER.advice, _HOPPER.env,
                     "H200: no playbook of its own in the sister skills; H100's (the same Hopper, NVLink 8)"),
    "b200": _B200,
    "b300": Playbook(
        "B300",
        (*_B200.advice,
         Advice(Topic.dispatcher, "Bridge's B300 perf recipes run HybridEP inside the 8-GPU node "
                "(NVLINK_DOMAIN_SIZE=8, USE_MNNVL=0); DeepEP runs on B300 (Bridge matches the name "
                "\"NVIDIA B300\")", f"{CODE}megatron/bridge/perf_recipes/qwen_vl/b300/qwen35_vl.py:72-80")),
        (*_B200.env,
         EnvVar("NCCL_IGNORE_CPU_AFFINITY", "1", "Bridge's B300 recipes' CPU-affinity setting",
                f"{CODE}megatron/bridge/perf_recipes/qwen_vl/b300/qwen35_vl.py:80", frozenset({"b300"}))),
        "B300: no playbook of its own in the sister skills; B200's (the same 8-GPU NVLink node) with "
        "Bridge's B300 recipe settings",
    ),
    "gb200": _grace_blackwell("GB200", ()),
    "gb300": _grace_blackwell("GB300", (
        Advice(Topic.measure, "GB300 needs remeasuring: no published VLM number yet. Bridge's GB300 "
               "Qwen3-VL-235B recipe is TP1 PP1 EP64, MBS 1 / GBS 1024, HybridEP with 64 ranks per "
               "NVLink domain", f"{HW}; {CODE}megatron/bridge/perf_recipes/qwen_vl/gb300/qwen3_vl.py:28-80"),
    )),
}  # fmt: skip


def graph_scope(spec: RunSpec) -> tuple[str, str]:
    """The CUDA-graph option this model's playbook recommends once the loop is stable, and why."""
    if spec.model.arch == Arch.qwen3_5_moe:
        return "none", (
            "Qwen3.5-VL: Bridge's perf recipes run without CUDA graphs for variable-length VLM inputs; the "
            "card's Qwen3.5 graph row contradicts them"
        )
    if not profile(spec.model.arch).graphs_capture_attention:  # G009
        return "te_moe", (
            "Qwen3-VL: TE scope [moe_router, moe_preprocess], what every Bridge Qwen3-VL perf recipe forces; the attn "
            "scope breaks Qwen3VLModel capture (rule G009)"
        )
    return "te_attn_moe", "TE scope [attn, moe_router, moe_preprocess]: the guide's safer MoE default"


def _graph_advice(spec: RunSpec) -> Advice:
    choice, why = graph_scope(spec)
    if choice == "none":
        return Advice(Topic.graphs, f"{why}: keep cuda_graph=none", f"{QWEN35_GRAPHS}; {SKILLS} 3.2")
    return Advice(
        Topic.graphs,
        f"{why} (cuda_graph={choice}); full recompute with a TE scope asserts (rule G007): selective "
        "recompute with it",
        f"{QWEN3_VL_GRAPHS}; {GRAPHS} [main]",
        (f"cuda_graph={choice}", "recompute=selective"),
    )


def _points(overrides: list[str]) -> list[list[str]]:
    """Every point of a command whose values may be sweep axes (`key=a,b`)."""
    points: list[list[str]] = [[]]
    for override in overrides:
        key, value = override.split("=", 1)
        values = value.split(",") if "," in value and not value.startswith("[") else [value]
        points = [[*point, f"{key}={v}"] for point in points for v in values]
    return points


def runnable(base: list[str], changes: tuple[str, ...]) -> tuple[str | None, str]:
    """(the command line, "") when every point composes and validates, else (None, why not)."""
    overrides = set_overrides(base, *changes)
    for point in _points(overrides):
        try:
            spec = compose_spec(point)
        except Exception:  # a combination Hydra rejects is not a command to print
            return None, f"{' '.join(point)} does not compose"
        blocking = errors(validate(spec))
        if blocking:
            first = blocking[0]
            return None, f"{', '.join(f.code for f in blocking)}: {first.message.rstrip('.')}"
    sweep = any("," in o.split("=", 1)[1] and not o.split("=", 1)[1].startswith("[") for o in overrides)
    return ("python train.py " + ("-m " if sweep else "") + " ".join(shlex.quote(o) for o in overrides)), ""


def _advice_lines(advice: Advice, bases: list[tuple[str, list[str]]]) -> list[str]:
    lines = [f"  [{advice.topic.value}] {advice.text} ({advice.source})"]
    if not advice.changes:
        return lines
    why_not: list[str] = []
    for label, base in bases:
        if all(change in base for change in advice.changes):
            lines.append(f"    (the {label} already has {' '.join(advice.changes)})")
            return lines
        line, reason = runnable(base, advice.changes)
        if line is not None:
            lines.append(f"    {line}" + (f"    # from the {label}" if label != bases[0][0] else ""))
            return lines
        why_not.append(f"from the {label}: {reason}")
    lines.append("    not runnable " + "; nor ".join(why_not))
    return lines


def _env_block(head: str, env: list[EnvVar]) -> list[str]:
    if not env:
        return []
    width = max(len(f"{v.name}={v.value}") for v in env)
    lines = [f"  [environment] {head}"]
    for var in env:
        setting = f"{var.name}={var.value}"
        lines.append(f"    {setting:<{width}}  " + (f"{var.why} " if var.why else "") + f"({var.source})")
    return lines


def _setup_example(env: list[EnvVar]) -> str:
    shown = ", ".join(f'"export {v.name}={v.value}"' for v in env[:2])
    return f"setup: [{shown}{', ...' if len(env) > 2 else ''}]"


def _env_lines(playbook: Playbook, spec: RunSpec) -> list[str]:
    """Who sets each recommended variable for this run: the perf recipe, this tool, or the user."""
    recipe = select_recipe(spec)
    by_recipe = [
        v for v in playbook.env if recipe is not None and (v.set_by is None or recipe.gpu in v.set_by)
    ]
    by_user = [v for v in playbook.env if v not in by_recipe]
    out = _env_block(
        f"set by Bridge's perf recipe {recipe.function if recipe else ''} (cfg.env_vars, applied on each rank "
        f"by {APPLY_ENV}; a value already in the job's environment wins):",
        by_recipe,
    )
    if spec.dispatcher.backend is FlexBackend.hybridep:
        derived = [
            EnvVar(name, str(value), "", f"{SKILLS} 2.2: must match the real NVLink domain")
            for name, value in hybridep_topology(spec).items()
        ]
        out += _env_block(
            "set by this tool for HybridEP, derived from the cluster and EP (dispatcher.hybridep_* overrides "
            "them; rule D007 checks an override):",
            derived,
        )
    where = f"not set by {recipe.function}" if recipe else "no recipe sets them"
    out += _env_block(
        f"recommended, {where}: put them in the site file's setup lines ({_setup_example(by_user)}):",
        by_user,
    )
    return out


def playbook_lines(spec: RunSpec, start: list[str], candidate_3d: list[str] | None) -> list[str]:
    """The platform's playbook for the settled start (and 3D candidate), each line with its source.

    [] off the GPU clusters the sister skills cover, and for the torch engine.
    """
    playbook = PLAYBOOKS.get(spec.cluster.name)
    if playbook is None or spec.engine != Engine.megatron:
        return []
    bases = [("start above", start)]
    if candidate_3d is not None:
        bases.append(("3D candidate", candidate_3d))
    out = [
        "",
        f"platform playbook: {playbook.platform} (cluster={spec.cluster.name}; the sister skills' "
        f"per-platform advice, {SKILLS} 2.2-2.3, each line with its source):",
    ]
    if playbook.note:
        out.append(f"  note: {playbook.note}")
    for advice in (*playbook.advice, _graph_advice(spec)):
        out += _advice_lines(advice, bases)
    out += _env_lines(playbook, spec)
    return out
