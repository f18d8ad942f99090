"""`moe-vlm advise`: the field guide (../shared/GUIDE.md) as code.

    moe-vlm advise model=qwen3_vl_235b_a22b cluster=gb200 nodes=16 goal=bring-up
    moe-vlm advise model=qwen3_vl_30b_a3b cluster=b200 goal=peak-throughput
    moe-vlm advise sweep=multirun/<sweep dir>

The overrides are train.py's (composed with Hydra's compose API against conf/). Before any run
the advisor recommends FSDP or 3D with the guide's reasons and a starting configuration for the
cluster (dispatcher, EP, recompute, CUDA-graph scope, vision freeze) that passes
moe_vlm.rules.validate and that moe_vlm.memory predicts to fit, printed as a runnable
`python train.py ...` line. With sweep=PATH it reads every run.json under PATH and says what to
try next; every suggestion is a runnable command line. Bad input: one line, exit status 2.
"""

from __future__ import annotations

import copy
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from moe_vlm.compose import CONF_DIR, CONFIG_NAME, BadInput, preflight
from moe_vlm.memory import THIN_HEADROOM_FRACTION, MemoryEstimate, estimate, fits_after, memory_variants
from moe_vlm.record import RUN_JSON
from moe_vlm.rules import Finding, errors, validate
from moe_vlm.schema import DataKind, RecomputeGranularity
from moe_vlm.spec import RunSpec

GOALS = ("bring-up", "peak-throughput")
FSDP_LABEL = "FSDP (Megatron FSDP: TP=1 CP=1 PP=1, EP sized to the experts)"
EXIT_BAD_INPUT = 2
# A component whose share of the step is at least this "dominates" it.
VISION_DOMINATES_SHARE = 0.40
# Throughput counts as still rising with MBS when the largest MBS beats the previous one by this.
MBS_RISING_MARGIN = 0.03
MBS_LADDER = (1, 2, 4, 8)
PIPELINE_LADDER = (1, 2, 4, 8, 16)
# Group keys the advisor sets when the user did not.
CHOSEN_KEYS = ("parallelism", "dispatcher", "recompute", "cuda_graph", "vision_freeze", "data", "mbs")


@dataclass(frozen=True)
class Suggestion:
    topic: str
    why: str
    command: str


@dataclass
class Request:
    goal: str
    sweep: Path | None
    overrides: list[str]


# --- command lines and composition -------------------------------------------------------------------


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def set_overrides(overrides: list[str], *changes: str) -> list[str]:
    """overrides with each `key=value` of changes replacing the same key and the key's sub-keys."""
    out = list(overrides)
    for change in changes:
        key = override_key(change)
        out = [o for o in out if override_key(o) != key and not override_key(o).startswith(key + ".")]
        out.append(change)
    return out


def command(overrides: list[str]) -> str:
    return "python train.py " + " ".join(shlex.quote(o) for o in overrides)


_GROUPS_CACHE: dict[tuple[str, ...], DictConfig] = {}
_SPEC_CACHE: dict[tuple[str, ...], RunSpec] = {}


def _is_group_choice(override: str) -> bool:
    return (CONF_DIR / override_key(override)).is_dir()


def _compose_groups(group_overrides: tuple[str, ...]) -> DictConfig:
    if group_overrides not in _GROUPS_CACHE:
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
                _GROUPS_CACHE[group_overrides] = compose(
                    config_name=CONFIG_NAME, overrides=list(group_overrides)
                )
        finally:
            GlobalHydra.instance().clear()
    return _GROUPS_CACHE[group_overrides]


def compose_spec(overrides: list[str], check: bool = False) -> RunSpec:
    """The RunSpec train.py would build from these overrides.

    Group choices (model=, recompute=, ...) are composed by Hydra once per combination; value
    overrides (mbs=4, pp=2, recompute.modules=[...]) are then set on a copy, in order, through
    the same structured config, so type errors still raise. check=True runs compose.preflight
    first: user input that does not compose is one line (BadInput) naming the key and a fix.
    """
    key = tuple(overrides)
    if key not in _SPEC_CACHE:
        if check:
            preflight(list(overrides))
        groups = tuple(o for o in overrides if _is_group_choice(o))
        cfg = copy.deepcopy(_compose_groups(groups))
        for override in overrides:
            if not _is_group_choice(override):
                name, value = override.split("=", 1)
                OmegaConf.update(cfg, name.lstrip("+"), yaml.safe_load(value), merge=False)
        _SPEC_CACHE[key] = RunSpec.from_config(cfg)
    return _SPEC_CACHE[key]


def parse(argv: list[str]) -> Request:
    goal, sweep = "bring-up", None
    overrides: list[str] = []
    for arg in argv:
        if "=" not in arg or arg.startswith("-"):
            raise BadInput(
                f"{arg}: not a key=value override. Fix: e.g. moe-vlm advise model=qwen3_vl_30b_a3b "
                "cluster=gb200 goal=bring-up (or sweep=PATH)."
            )
        key, value = arg.split("=", 1)
        if key == "goal":
            if value not in GOALS:
                raise BadInput(
                    f"goal={value}: not one of {', '.join(GOALS)}. Fix: goal=bring-up or "
                    "goal=peak-throughput."
                )
            goal = value
        elif key == "sweep":
            sweep = Path(value).expanduser()
            if not sweep.is_dir():
                raise BadInput(
                    f"sweep={value}: no such directory. Fix: sweep=PATH to a sweep's output directory "
                    "(the multirun/... directory holding the points' run.json files)."
                )
            if not any(sweep.rglob(RUN_JSON)):
                raise BadInput(
                    f"sweep={value}: no {RUN_JSON} under it. Fix: point sweep= at a sweep that has run."
                )
        else:
            if "," in value and not value.startswith(("[", "'", '"')):
                raise BadInput(
                    f"{arg}: advise takes one configuration, not a sweep. Fix: give a single value, e.g. "
                    f"{key}={value.split(',')[0]}."
                )
            overrides.append(arg)
    return Request(goal, sweep, overrides)


# --- before any run: family and a starting configuration ---------------------------------------------


@dataclass
class Start:
    family: str
    overrides: list[str]
    spec: RunSpec
    findings: list[Finding]
    memory: MemoryEstimate
    why: list[str] = field(default_factory=list)


def _user_keys(overrides: list[str]) -> set[str]:
    return {override_key(o).split(".")[0] for o in overrides}


def _graph_choice(spec: RunSpec, goal: str) -> tuple[str, str]:
    if spec.engine != "megatron":
        return "none", "the torch engine has no CUDA graphs"
    if goal == "bring-up":
        return "none", "CUDA graphs are useful after bring-up, once the training loop is stable"
    if spec.model.arch == "qwen3_vl_moe":
        return "te_moe", (
            "TE-scoped [moe_router, moe_preprocess]: narrow, and what Bridge's Qwen3-VL recipes use "
            "(the attn scope breaks Qwen3VLModel capture)"
        )
    return "te_attn_moe", "TE-scoped [attn, moe_router, moe_preprocess]: the guide's safer MoE default"


def _fits_comfortably(found: MemoryEstimate) -> bool:
    return found.headroom_fraction is None or found.headroom_fraction >= THIN_HEADROOM_FRACTION


def _candidate(overrides: list[str]) -> tuple[RunSpec, list[Finding], MemoryEstimate] | None:
    try:
        spec = compose_spec(overrides)
    except Exception:  # a generated combination Hydra rejects is simply not a candidate
        return None
    return spec, validate(spec), estimate(spec)


def _settle(
    overrides: list[str], allow_variants: bool = True
) -> tuple[list[str], RunSpec, list[Finding], MemoryEstimate] | None:
    """overrides, or (allow_variants) the first memory variant of them, that validates without errors."""
    found = _candidate(overrides)
    if found is None:
        return None
    spec, findings, memory = found
    if not errors(findings):
        return overrides, spec, findings, memory
    if not allow_variants or {f.code for f in errors(findings)} != {"M001"}:
        return None
    for variant in memory_variants(spec):
        variant_findings = validate(variant.spec)
        if not errors(variant_findings):
            changed = set_overrides(overrides, *shlex.split(variant.overrides))
            return changed, variant.spec, variant_findings, estimate(variant.spec)
    return None


def _pipeline_split(layers: int, pp: int) -> list[str]:
    """pp, and first/last stage layers when the decoder does not split evenly (embedding, vision first)."""
    if layers % pp == 0:
        return [f"pp={pp}"]
    if pp == 2:
        return [
            f"pp={pp}",
            f"parallelism.first_stage_layers={layers // 2}",
            f"parallelism.last_stage_layers={layers - layers // 2}",
        ]
    for edge in range(layers // pp, 0, -1):
        middle = layers - 2 * edge
        if middle > 0 and middle % (pp - 2) == 0:
            return [
                f"pp={pp}",
                f"parallelism.first_stage_layers={edge}",
                f"parallelism.last_stage_layers={edge}",
            ]
    return [f"pp={pp}"]


def starting_point(base: list[str], goal: str, family: str) -> Start | None:
    """The guide's starting configuration for this cluster, settled against the rules and the memory estimate.

    Keys the user gave are kept. bring-up: MBS 1, full recompute, no CUDA graphs. peak-throughput:
    the largest MBS of 8, 4, 2, 1 with selective recompute and narrow TE graphs that fits with
    headroom; only when none does, the estimate's cheapest memory change is allowed.
    """
    user = _user_keys(base)
    probe = compose_spec(base)
    choices = {
        "parallelism": family,
        "dispatcher": probe.cluster.default_dispatcher if probe.engine == "megatron" else "alltoall",
        "cuda_graph": _graph_choice(probe, goal)[0],
        "vision_freeze": "none",
        "recompute": "full" if goal == "bring-up" else "selective",
    }
    if probe.data.kind is DataKind.mock or "data" not in user:
        choices["data"] = "synthetic"
    ladder = (1,) if goal == "bring-up" else tuple(reversed(MBS_LADDER))
    pipelines = PIPELINE_LADDER if family == "3d" and "pp" not in user else (None,)
    for allow_variants in (False, True):
        for mbs in ladder:
            picks = {**choices, "mbs": str(mbs)}
            extra = [f"{k}={v}" for k, v in picks.items() if k not in user]
            for pp in pipelines:
                overrides = [*base, *extra]
                if pp is not None and pp > 1:
                    overrides = set_overrides(overrides, *_pipeline_split(probe.model.num_layers, pp))
                settled = _settle(overrides, allow_variants)
                if settled is not None and (goal == "bring-up" or _fits_comfortably(settled[3])):
                    final, spec, findings, memory = settled
                    return Start(
                        family, final, spec, findings, memory, explain(spec, goal, user, final != overrides)
                    )
    return None


def explain(spec: RunSpec, goal: str, user: set[str], changed_for_memory: bool) -> list[str]:
    """Why each knob of the settled configuration has its value (from the guide)."""
    lay = spec.layout
    why = [
        f"EP={lay.ep}{' (sized to the experts, inside the NVLink domain)' if lay.ep_auto else ''} "
        f"ETP={lay.etp}"
        + (f" PP={lay.pp}" if lay.pp > 1 else "")
        + ("; ETP=1: ETP is a fitting tool, not a default" if lay.etp == 1 else "")
    ]
    dispatcher = spec.dispatcher.name
    if spec.engine == "torch":
        why.append(f"dispatcher={dispatcher}: the torch engine keeps every expert on each rank")
    elif dispatcher == "hybridep":
        why.append(f"dispatcher=hybridep: the strong default on {spec.cluster.name}")
    else:
        why.append(f"dispatcher={dispatcher}: the {spec.cluster.name} default")
    graph = spec.cuda_graph.name
    if "cuda_graph" in user:
        why.append(f"cuda_graph={graph}: as requested")
    elif graph == "none":
        reason = (
            "the torch engine has no CUDA graphs"
            if spec.engine == "torch"
            else "full recompute works only with full-iteration graphs"
            if spec.recompute.granularity is RecomputeGranularity.full and goal != "bring-up"
            else "CUDA graphs are useful after bring-up, once the training loop is stable"
        )
        why.append(f"cuda_graph=none: {reason}")
    else:
        why.append(f"cuda_graph={graph}: {_graph_choice(spec, goal)[1]}")
    if spec.data.kind is DataKind.synthetic and "data" not in user:
        why.append(
            "data=synthetic: realistic image payloads; image-free mock data ran about 2x faster than "
            "real input"
        )
    recompute = spec.recompute.name
    if "recompute" in user:
        why.append(f"recompute={recompute}: as requested")
    elif spec.recompute.granularity is RecomputeGranularity.full:
        why.append(
            "recompute=full: the bring-up setting; relax toward selective once the run is stable "
            "(sweep=mbs_recompute)"
            if goal == "bring-up"
            else "recompute=full: the estimate finds nothing lighter that fits"
        )
    else:
        modules = ", ".join(spec.recompute.modules)
        why.append(
            f"recompute=selective ({modules}): the usual steady state once the model fits"
            + ("; the estimate needed more than core_attn" if changed_for_memory else "")
        )
    if not spec.freeze.vision:
        why.append(
            "vision_freeze=none: train what the workload trains; vision_freeze=vision for "
            "decoder-focused tuning"
        )
    else:
        why.append("vision_freeze=vision: frozen to fit (less memory, a small throughput gain)")
    why.append(
        f"mbs={spec.mbs}: "
        + (
            "start small"
            if goal == "bring-up"
            else "the largest of 8, 4, 2, 1 predicted to fit with headroom; sweep it"
        )
    )
    return why


def family_reasons(goal: str, cluster: str) -> tuple[str, list[str]]:
    if goal == "bring-up":
        reasons = [
            "bring-up: the guide's workflow is 'get a reliable run on FSDP first'; it is the easiest way to "
            "get a multimodal run working",
            "a VLM has awkward pipeline-stage boundaries (embedding / vision / decoder); FSDP needs none",
            "fitting in memory matters more than peak throughput at this stage",
        ]
        family = "fsdp"
    else:
        reasons = [
            "peak throughput: 3D parallel has the higher ceiling once tuned, but only when the model "
            "is already "
            "stable on FSDP, the PP layout is clear and reproducible, and MBS, recompute and "
            "CUDA-graph scope "
            "are swept together",
            "before any run there is no FSDP evidence yet: start on FSDP, move to the 3D candidate "
            "below once "
            "the FSDP run is stable on real or synthetic data",
        ]
        family = "fsdp"
    if cluster == "gb200":
        reasons.append(
            "GB200: FSDP already reaches healthy utilisation (high-teens % MFU) with a simple setup"
        )
    elif cluster == "b200":
        reasons.append(
            "B200: FSDP works but is more sensitive to the recompute choice and to freezing the "
            "vision stack: "
            "sweep recompute and vision_freeze (sweep=mbs_recompute, sweep=vision_freeze)"
        )
    return family, reasons


def before_any_run(request: Request) -> list[str]:
    base = request.overrides
    probe = compose_spec(base, check=True)
    family, reasons = family_reasons(request.goal, probe.cluster.name)
    user_family = next((o.split("=", 1)[1] for o in base if override_key(o) == "parallelism"), None)
    if user_family:
        family = user_family
        reasons.insert(0, f"parallelism={user_family} as requested")
    out = [
        f"== moe-vlm advise: {' '.join(base) or '(defaults)'} goal={request.goal} ==",
        "",
        "family: " + (FSDP_LABEL if family == "fsdp" else "3D parallel (TP/PP/CP + EP/ETP)"),
        *[f"  - {r}" for r in reasons],
        "",
    ]
    start = starting_point(base, request.goal, family)
    if start is None and family == "fsdp" and not user_family and probe.engine == "megatron":
        out.append(
            "  - FSDP is predicted not to fit on this world size: 3D parallel (with PP) is needed for memory"
        )
        start = starting_point(base, request.goal, "3d")
    if start is None:
        out += [
            f"start: nothing validates on {probe.layout.world_size} rank(s) of {probe.cluster.name}: "
            f"the memory estimate or a rule rejects every candidate.",
            f"  try more nodes: {command(set_overrides(base, f'nodes={probe.layout.nodes * 2}'))}",
        ]
        return out
    out += _describe_start("start", start)
    if probe.engine == "megatron" and start.family == "fsdp":
        nxt = starting_point(set_overrides(base, "parallelism=3d"), "peak-throughput", "3d")
        if nxt is not None:
            out += ["", *(_describe_start("next, once stable on FSDP (3D candidate)", nxt))]
    sweep_overrides = [o for o in start.overrides if override_key(o) not in ("mbs", "recompute")]
    out += [
        "",
        "then sweep MBS x recompute together (the setting that fits is often not the fastest steady state):",
        f"  python train.py -m sweep=mbs_recompute {' '.join(shlex.quote(o) for o in sweep_overrides)}",
        "  moe-vlm advise sweep=<that sweep's directory>",
    ]
    return out


def _describe_start(title: str, start: Start) -> list[str]:
    memory = start.memory
    warnings = [f for f in start.findings if not f.is_error]
    if memory.capacity_gib is not None:
        fit = (
            f"predicted peak {memory.total_gib:.1f} GiB of {memory.capacity_gib:.1f} GiB per GPU "
            f"({memory.headroom_fraction:.0%} headroom)"
        )
    else:
        fit = f"predicted peak {memory.total_gib:.2f} GiB per rank ({memory.measured_as})"
    lines = [
        f"{title}:",
        f"  {command(start.overrides)}",
        f"  {fit}; validation: 0 errors, {len(warnings)} warning(s)"
        + (f" ({', '.join(sorted({f.code for f in warnings}))})" if warnings else ""),
    ]
    lines += [f"  - {w}" for w in start.why]
    return lines


# --- after a sweep -------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    path: Path
    status: str
    overrides: list[str]
    data_kind: str
    summary: dict[str, Any]
    failure: dict[str, Any]
    spec: RunSpec | None

    @property
    def throughput(self) -> float | None:
        value = self.summary.get("effective_tokens_per_s_per_gpu")
        return float(value) if isinstance(value, int | float) else None

    @property
    def label(self) -> str:
        return " ".join(self.overrides)


def canonical_overrides(config: dict[str, Any]) -> list[str]:
    """Overrides that rebuild a run from its resolved config (used when .hydra/overrides.yaml is missing)."""
    out = []
    groups = {
        "model": ("model", "name"),
        "cluster": ("cluster", "name"),
        "parallelism": ("parallelism", "family"),
        "dispatcher": ("dispatcher", "name"),
        "recompute": ("recompute", "name"),
        "cuda_graph": ("cuda_graph", "name"),
        "vision_freeze": ("vision_freeze", "name"),
        "data": ("data", "kind"),
    }
    for key, (group, name) in groups.items():
        value = (config.get(group) or {}).get(name)
        if value is not None:
            out.append(f"{key}={value}")
    if (config.get("data") or {}).get("path"):
        out.append(f"data.path={config['data']['path']}")
    for key in ("engine", "nodes", "nproc", "mbs", "gbs", "seq_length", "tp", "pp", "vp", "cp", "ep", "etp"):
        value = config.get(key)
        if value is not None and not (key == "engine" and value == "auto"):
            out.append(f"{key}={value}")
    return out


def load_records(root: Path) -> list[RunRecord]:
    records = []
    for path in sorted(root.rglob(RUN_JSON)):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        overrides_file = path.parent / ".hydra" / "overrides.yaml"
        if overrides_file.is_file():
            overrides = [str(o) for o in yaml.safe_load(overrides_file.read_text()) or []]
        else:
            overrides = canonical_overrides(record.get("config") or {})
        # Sweep-only keys (presets, launcher) are not part of a single point's command line.
        overrides = [o for o in overrides if not override_key(o).startswith(("hydra", "sweep"))]
        try:
            spec: RunSpec | None = compose_spec(overrides)
        except Exception:  # a record from an older schema: no memory-based suggestions for it
            spec = None
        records.append(
            RunRecord(
                path=path,
                status=str(record.get("status", "unknown")),
                overrides=overrides,
                data_kind=str((record.get("data") or {}).get("kind", "unknown")),
                summary=record.get("summary") or {},
                failure=record.get("failure") or {},
                spec=spec,
            )
        )
    return records


def _validated(overrides: list[str]) -> tuple[RunSpec, MemoryEstimate] | None:
    found = _candidate(overrides)
    if found is None or errors(found[1]):
        return None
    return found[0], found[2]


def suggest_mock(records: list[RunRecord]) -> list[Suggestion]:
    mocks = [r for r in records if r.status == "completed" and r.data_kind == DataKind.mock.value]
    if not mocks:
        return []
    best = max(mocks, key=lambda r: r.throughput or 0.0)
    return [
        Suggestion(
            "mock data used as evidence",
            f"{len(mocks)} completed run(s) used data=mock: image-free runs came out about 2x faster "
            "than real "
            "multimodal input, so their throughput says little about the VLM; rerun the best one on "
            "realistic "
            "images (mock and real results are never ranked together)",
            command(set_overrides(best.overrides, "data=synthetic")),
        )
    ]


def suggest_oom(records: list[RunRecord]) -> list[Suggestion]:
    out = []
    for r in records:
        if r.status != "failed" or r.failure.get("class") != "oom" or r.spec is None:
            continue
        change = fits_after(r.spec)
        if change is None:
            continue
        overrides = change.split(" (predicted")[0]
        out.append(
            Suggestion(
                "out of memory",
                f"`{r.label}` ran out of memory; the estimate's first change that fits: {change}",
                command(set_overrides(r.overrides, *shlex.split(overrides))),
            )
        )
    return out


def suggest_vision(records: list[RunRecord]) -> list[Suggestion]:
    dominated = [
        r
        for r in records
        if r.status == "completed"
        and r.data_kind != DataKind.mock.value
        and float((r.summary.get("components") or {}).get("vision_encoder") or 0.0) >= VISION_DOMINATES_SHARE
    ]
    if not dominated:
        return []
    r = max(dominated, key=lambda rec: rec.throughput or 0.0)
    share = float(r.summary["components"]["vision_encoder"])
    out = []
    why = (
        f"the vision encoder takes {share:.0%} of the step in `{r.label}`: profile encoder, projector and "
        "decoder separately before blaming the dispatcher (run.json summary.components has the split)"
    )
    if r.spec is not None and not r.spec.freeze.vision:
        out.append(
            Suggestion(
                "vision encoder dominates the step",
                why + "; for decoder-focused tuning freeze the vision stack (less compute and memory)",
                command(set_overrides(r.overrides, "vision_freeze=vision")),
            )
        )
    if r.spec is not None:
        bigger = set_overrides(r.overrides, f"mbs={r.spec.mbs * 2}")
        if _validated(bigger) is not None:
            out.append(
                Suggestion(
                    "vision encoder dominates the step",
                    f"raise MBS carefully: MBS {r.spec.mbs * 2} is predicted to fit, but the vision "
                    "path grows with it; compare effective tokens/s, not step time",
                    command(bigger),
                )
            )
    return out


def suggest_selective(records: list[RunRecord]) -> list[Suggestion]:
    out: list[Suggestion] = []
    full = [
        r
        for r in records
        if r.status == "completed"
        and r.data_kind != DataKind.mock.value
        and r.spec is not None
        and r.spec.recompute.granularity is RecomputeGranularity.full
        and isinstance(r.summary.get("peak_memory_gib"), int | float)
        and r.spec.cluster.is_gpu_cluster
        and r.spec.cluster.gpu_memory_gib > 0
    ]
    seen: set[tuple[str, ...]] = set()
    for r in sorted(full, key=lambda rec: rec.throughput or 0.0, reverse=True):
        assert r.spec is not None
        relaxed = set_overrides(r.overrides, "recompute=selective")
        if r.spec.cuda_graph.impl.value == "full_iteration":
            continue
        key = tuple(sorted(o for o in relaxed if override_key(o) != "mbs"))
        if key in seen:
            continue
        checked = _validated(relaxed)
        if checked is None:
            continue
        seen.add(key)
        relaxed_memory = checked[1]
        kind = str(r.summary.get("memory_kind") or "cuda_max_allocated")
        # The measured peak plus what the estimate says selective adds, on the quantity that was measured.
        delta = relaxed_memory.comparable_gib(kind) - estimate(r.spec).comparable_gib(kind)
        outside = relaxed_memory.total_gib - relaxed_memory.allocated_gib
        predicted = float(r.summary["peak_memory_gib"]) + delta + outside
        capacity = r.spec.cluster.gpu_memory_gib
        if predicted <= capacity * (1 - THIN_HEADROOM_FRACTION):
            out.append(
                Suggestion(
                    "full recompute with headroom",
                    f"`{r.label}` peaked at {r.summary['peak_memory_gib']:.1f} GiB ({kind}) of "
                    f"{capacity:.0f} GiB "
                    f"with full recompute; selective is predicted at {predicted:.1f} GiB: relax to "
                    "selective, "
                    "the usual faster steady state",
                    command(relaxed),
                )
            )
    return out[:2]


def suggest_etp(records: list[RunRecord]) -> list[Suggestion]:
    out = []
    seen: set[tuple[str, ...]] = set()
    for r in records:
        if r.spec is None or r.spec.layout.etp <= 1:
            continue
        lay = r.spec.layout
        wider = lay.ep * lay.etp
        if r.spec.model.num_experts % wider or wider * lay.tp > lay.nvlink_domain_gpus:
            continue
        changed = set_overrides(r.overrides, f"ep={wider}", "etp=1")
        if tuple(changed) in seen or _validated(changed) is None:
            continue
        seen.add(tuple(changed))
        out.append(
            Suggestion(
                "ETP in use where EP alone fits",
                f"`{r.label}` uses ETP={lay.etp}; EP={wider} alone fits in memory and inside the "
                "NVLink domain. ETP adds communication and tuning surface: use it only when EP alone is not enough",
                command(changed),
            )
        )
    return out


def suggest_mbs(records: list[RunRecord]) -> list[Suggestion]:
    groups: dict[tuple[str, ...], list[RunRecord]] = {}
    for r in records:
        if (
            r.status != "completed"
            or r.data_kind == DataKind.mock.value
            or r.spec is None
            or r.throughput is None
        ):
            continue
        key = tuple(sorted(o for o in r.overrides if override_key(o) not in ("mbs", "gbs")))
        groups.setdefault(key, []).append(r)
    out = []
    for runs in groups.values():
        by_mbs = {r.spec.mbs: r for r in runs if r.spec is not None}
        if len(by_mbs) < 2:
            continue
        top, previous = sorted(by_mbs)[-1], sorted(by_mbs)[-2]
        rate_top, rate_prev = by_mbs[top].throughput or 0.0, by_mbs[previous].throughput or 0.0
        if rate_top <= rate_prev * (1 + MBS_RISING_MARGIN):
            continue
        curve = ", ".join(f"MBS {m}: {by_mbs[m].throughput:,.0f}" for m in sorted(by_mbs))
        nxt = set_overrides(by_mbs[top].overrides, f"mbs={top * 2}")
        why = (
            f"effective tokens/s/GPU is still rising with MBS ({curve}; "
            f"+{rate_top / rate_prev - 1:.0%} at the last step): VLMs are MBS-sensitive, sweep further"
        )
        if _validated(nxt) is not None:
            out.append(
                Suggestion("MBS still rising", why + f"; MBS {top * 2} is predicted to fit", command(nxt))
            )
        else:
            spec = compose_spec(nxt)
            change = fits_after(spec)
            if change is not None:
                extra = shlex.split(change.split(" (predicted")[0])
                out.append(
                    Suggestion(
                        "MBS still rising",
                        why + f"; MBS {top * 2} needs more memory: {change}",
                        command(set_overrides(nxt, *extra)),
                    )
                )
    return out


def after_sweep(request: Request) -> list[str]:
    assert request.sweep is not None
    records = load_records(request.sweep)
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    suggestions = [
        *suggest_mock(records),
        *suggest_oom(records),
        *suggest_vision(records),
        *suggest_selective(records),
        *suggest_etp(records),
        *suggest_mbs(records),
    ]
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    out = [
        f"== moe-vlm advise: sweep={request.sweep} ({len(records)} runs: {status}) goal={request.goal} ==",
        "",
    ]
    if not suggestions:
        out.append(
            "nothing to flag: no mock evidence, no OOM, no dominant vision encoder, no recompute or "
            "ETP to relax,"
        )
        out.append(
            "and MBS is no longer rising. Compare the ranked results: moe-vlm report " + str(request.sweep)
        )
    for number, s in enumerate(suggestions, 1):
        out += [f"{number}. [{s.topic}] {s.why}.", f"   {s.command}", ""]
    return out


def main(argv: list[str]) -> int:
    try:
        request = parse(list(argv))
        if request.sweep is not None:
            if request.overrides:
                raise BadInput(
                    f"{request.overrides[0]}: with sweep=PATH the configurations come from the "
                    "sweep's run.json "
                    "files. Fix: drop the overrides, or drop sweep= to plan a first run."
                )
            lines = after_sweep(request)
        else:
            lines = before_any_run(request)
    except BadInput as exc:
        print(f"moe-vlm advise: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print("\n".join(lines))
    return 0
