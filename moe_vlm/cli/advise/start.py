"""The advisor before any run: the parallelism family and a starting configuration.

The guide's starting point for the cluster, settled against the rules (moe_vlm.rules) and the
memory estimate (moe_vlm.perf.memory), with why each knob has its value.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from moe_vlm.base.errors import BadInput
from moe_vlm.cli.advise.playbook import graph_scope, playbook_lines
from moe_vlm.config.compose import compose_spec, override_key, set_overrides
from moe_vlm.config.preflight import preflight
from moe_vlm.config.schema import CudaGraphImpl, DataKind, Engine, RecomputeGranularity
from moe_vlm.config.spec import PipelineSplit, RunSpec
from moe_vlm.data.stats import MOCK_SPEEDUP_NOTE
from moe_vlm.knobs.support import accepts
from moe_vlm.perf.memory import THIN_HEADROOM_FRACTION, MemoryEstimate, estimate, memory_variants
from moe_vlm.predict.model import predict
from moe_vlm.rules import Finding, errors, validate
from moe_vlm.rules.catalogue import CATALOGUE
from moe_vlm.runtime.points import sweep_name

GOALS = ("bring-up", "peak-throughput")
FSDP_LABEL = "FSDP (Megatron FSDP: TP=1 CP=1 PP=1, EP sized to the experts)"
MBS_LADDER = (1, 2, 4, 8)
PIPELINE_LADDER = (1, 2, 4, 8, 16)
# A warning the start resolves by applying its rule's fix, when the result still validates (and,
# past bring-up, fits with headroom): O007, Megatron FSDP sharded across NVLink-domain segments.
APPLIED_FIXES: dict[str, tuple[str, ...]] = {"O007": ("parallelism.dp_outer=0",)}
# A warning the start keeps on purpose, by goal, and why.
KEPT_WARNINGS: dict[tuple[str, str], str] = {
    ("R003", "bring-up"): "bring-up keeps full recompute on purpose; the MBS x recompute sweep below "
    "relaxes it once the run is stable",
}


def command(overrides: list[str]) -> str:
    return "python train.py " + " ".join(shlex.quote(o) for o in overrides)


@dataclass
class Start:
    family: str
    overrides: list[str]
    spec: RunSpec
    findings: list[Finding]
    memory: MemoryEstimate
    why: list[str] = field(default_factory=list)
    goal: str = "bring-up"


def _user_keys(overrides: list[str]) -> set[str]:
    return {override_key(o).split(".")[0] for o in overrides}


def _no_graphs(spec: RunSpec) -> str | None:
    """Why this engine runs no CUDA graphs (knobs/support.py); None when it does."""
    if accepts(spec.engine, "cuda_graph.impl", CudaGraphImpl.transformer_engine):
        return None
    return f"the {spec.engine} engine has no CUDA graphs"


def _graph_choice(spec: RunSpec, goal: str) -> tuple[str, str]:
    no_graphs = _no_graphs(spec)
    if no_graphs:
        return "none", no_graphs
    if goal == "bring-up":
        return "none", "CUDA graphs are useful after bring-up, once the training loop is stable"
    return graph_scope(spec)  # the model's playbook: Qwen3.5 runs without graphs


def _fits_comfortably(found: MemoryEstimate) -> bool:
    return found.headroom_fraction is None or found.headroom_fraction >= THIN_HEADROOM_FRACTION


def candidate(overrides: list[str]) -> tuple[RunSpec, list[Finding], MemoryEstimate] | None:
    try:
        spec = compose_spec(overrides)
    except Exception:  # a generated combination Hydra rejects is simply not a candidate
        return None
    return spec, validate(spec), estimate(spec)


def _settle(
    overrides: list[str], allow_variants: bool = True
) -> tuple[list[str], RunSpec, list[Finding], MemoryEstimate] | None:
    """overrides, or (allow_variants) the first memory variant of them, that validates without errors."""
    found = candidate(overrides)
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
    split = PipelineSplit.balanced(layers, pp)
    if not (split.first or split.last):
        return [f"pp={pp}"]
    return [
        f"pp={pp}",
        f"parallelism.first_stage_layers={split.first}",
        f"parallelism.last_stage_layers={split.last}",
    ]


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
        "dispatcher": probe.cluster.default_dispatcher if probe.engine == Engine.megatron else "alltoall",
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
                    changed_for_memory = settled[0] != overrides
                    (final, spec, findings, memory), fixed = _apply_fixes(settled, goal)
                    why = knob_reasons(spec, goal, user, changed_for_memory)
                    return Start(family, final, spec, findings, memory, [*why, *fixed], goal)
    return None


Settled = tuple[list[str], RunSpec, list[Finding], MemoryEstimate]


def _apply_fixes(settled: Settled, goal: str) -> tuple[Settled, list[str]]:
    """settled with each warning of APPLIED_FIXES resolved by its rule's fix where the result still
    validates (and fits with headroom past bring-up); the reasons for the changes made."""
    reasons: list[str] = []
    for found in settled[2]:
        fix = APPLIED_FIXES.get(found.code)
        if fix is None or found.is_error:
            continue
        tried = _settle(set_overrides(settled[0], *fix), allow_variants=False)
        if tried is None or found.code in {f.code for f in tried[2]}:
            continue
        if goal == "bring-up" or _fits_comfortably(tried[3]):
            settled = tried
            reasons.append(f"{' '.join(fix)}: the fix of {found.code} ({found.title}): {found.message}")
    return settled, reasons


def warning_lines(findings: list[Finding], goal: str) -> list[str]:
    """Each warning the start still has: kept on purpose (and why), or left to the user (its fix)."""
    lines = []
    for found in findings:
        if found.is_error:
            continue
        kept = KEPT_WARNINGS.get((found.code, goal))
        lines.append(
            f"  ! {found.code} {found.title}: kept: {kept}"
            if kept
            else f"  ! {found.code} {found.title}: {found.message} Fix: {found.fix}"
        )
    return lines


def knob_reasons(spec: RunSpec, goal: str, user: set[str], changed_for_memory: bool) -> list[str]:
    """Why each knob of the settled configuration has its value (from the guide)."""
    lay = spec.layout
    why = [
        f"EP={lay.ep}{' (sized to the experts, inside the NVLink domain)' if lay.ep_auto else ''} "
        f"ETP={lay.etp}"
        + (f" PP={lay.pp}" if lay.pp > 1 else "")
        + ("; ETP=1: ETP is a fitting tool, not a default" if lay.etp == 1 else "")
    ]
    dispatcher = spec.dispatcher.name
    if spec.engine == Engine.torch:
        why.append(f"dispatcher={dispatcher}: the torch engine keeps every expert on each rank")
    elif dispatcher == "hybridep":
        why.append(f"dispatcher=hybridep: the strong default on {spec.cluster.name}")
    else:
        why.append(f"dispatcher={dispatcher}: the {spec.cluster.name} default")
    graph = spec.cuda_graph.name
    if "cuda_graph" in user:
        why.append(f"cuda_graph={graph}: as requested")
    elif graph == "none":
        reason = _no_graphs(spec) or (
            "full recompute works only with full-iteration graphs"
            if spec.recompute.granularity is RecomputeGranularity.full and goal != "bring-up"
            else _graph_choice(spec, goal)[1]
        )
        why.append(f"cuda_graph=none: {reason}")
    else:
        why.append(f"cuda_graph={graph}: {_graph_choice(spec, goal)[1]}")
    if spec.data.kind is DataKind.synthetic and "data" not in user:
        why.append(f"data=synthetic: realistic image payloads; {MOCK_SPEEDUP_NOTE}")
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
            "GB200: FSDP already reaches healthy utilisation with a simple setup (the card's measured "
            "FSDP rows, card=qwen3_vl_fsdp_gb200); this start's own predicted MFU is printed with it below"
        )
    elif cluster == "b200":
        reasons.append(
            "B200: FSDP works but is more sensitive to the recompute choice and to freezing the "
            "vision stack: "
            "sweep recompute and vision_freeze (sweep=mbs_recompute, sweep=vision_freeze)"
        )
    return family, reasons


def before_any_run(base: list[str], goal: str) -> list[str]:
    preflight(list(base))
    probe = compose_spec(base)
    _reject_impossible(probe)
    family, reasons = family_reasons(goal, probe.cluster.name)
    user_family = next((o.split("=", 1)[1] for o in base if override_key(o) == "parallelism"), None)
    if user_family:
        family = user_family
        reasons.insert(0, f"parallelism={user_family} as requested")
    out = [
        f"== moe-vlm advise: {' '.join(base) or '(defaults)'} goal={goal} ==",
        "",
        "family: " + (FSDP_LABEL if family == "fsdp" else "3D parallel (TP/PP/CP + EP/ETP)"),
        *[f"  - {r}" for r in reasons],
        "",
    ]
    start = starting_point(base, goal, family)
    if start is None and family == "fsdp" and not user_family and probe.engine == Engine.megatron:
        out.append(
            "  - FSDP is predicted not to fit on this world size: 3D parallel (with PP) is needed for memory"
        )
        start = starting_point(base, goal, "3d")
    if start is None:
        out += [
            f"start: nothing validates on {probe.layout.world_size} rank(s) of {probe.cluster.name}: "
            f"the memory estimate or a rule rejects every candidate.",
            f"  try more nodes: {command(set_overrides(base, f'nodes={probe.layout.nodes * 2}'))}",
        ]
        return out
    out += _describe_start("start", start)
    nxt: Start | None = None
    if probe.engine == Engine.megatron and start.family == "fsdp":
        nxt = starting_point(set_overrides(base, "parallelism=3d"), "peak-throughput", "3d")
        if nxt is not None:
            out += ["", *(_describe_start("next, once stable on FSDP (3D candidate)", nxt))]
    out += ["", *mbs_recompute_lines(start.overrides)]
    out += playbook_lines(start.spec, start.overrides, nxt.overrides if nxt else None)
    return out


def mbs_recompute_lines(start: list[str]) -> list[str]:
    """The MBS x recompute sweep to run next, as sweeps whose every point is predicted to fit and
    validates (the preset itself when all of its points do), each with the advise command for
    the directory it will write."""
    base = [o for o in start if override_key(o) not in ("mbs", "recompute")]
    fits = {
        (mbs, recompute): (found := candidate(set_overrides(base, f"mbs={mbs}", f"recompute={recompute}")))
        is not None
        and not errors(found[1])
        for mbs in MBS_LADDER
        for recompute in ("full", "selective")
    }
    both = [m for m in MBS_LADDER if fits[(m, "full")] and fits[(m, "selective")]]
    full_only = [m for m in MBS_LADDER if fits[(m, "full")] and not fits[(m, "selective")]]
    sweeps: list[list[str]] = []
    if len(both) == len(MBS_LADDER):
        sweeps.append(["sweep=mbs_recompute", *base])
    else:
        if both:
            sweeps.append([*base, f"mbs={','.join(map(str, both))}", "recompute=full,selective"])
        if full_only:  # selective does not fit at these MBS: full recompute alone
            sweeps.append([*base, f"mbs={','.join(map(str, full_only))}", "recompute=full"])
    if not sweeps:
        return ["no MBS x recompute point is predicted to fit beyond the start above"]
    lines = [
        "then sweep MBS x recompute together (the setting that fits is often not the fastest steady "
        f"state; every point below is predicted to fit{'' if len(both) == len(MBS_LADDER) else ', the rest would be rejected'}):"
    ]
    for overrides in sweeps:
        lines += [
            f"  python train.py -m {' '.join(shlex.quote(o) for o in overrides)}",
            f"  moe-vlm advise sweep=multirun/{sweep_name(overrides)}",
        ]
    return lines


def _reject_impossible(spec: RunSpec) -> None:
    """A size of zero or below is bad input, not a configuration to advise on: one line, in the
    words of the rule that rejects it in a run (C001)."""
    sizes = next(r for r in CATALOGUE if r.code == "C001")
    for found in sizes.check(spec):  # C001 alone: other rules may not expect such sizes
        raise BadInput(f"{', '.join(found.keys)}: {found.message} Fix: {found.fix}")


def _predicted(spec: RunSpec) -> str:
    """The plan's own prediction for the start (the numbers `dry_run=true` prints), never a
    promise of our own: advise and the plan agree by construction."""
    found = predict(spec)
    if found.step_time_s is None:
        return f"predicted speed: none ({found.note})"
    mfu = (
        "no peak declared"
        if found.mfu is None
        else f"MFU {found.mfu:.1%} {found.range_text(found.mfu, '.1%', '', rate=True)} vs {found.peak_name}"
    )
    return f"predicted step {found.step_time_s:.3g} s, {mfu} (moe_vlm/predict; as dry_run=true prints it)"


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
        f"  {_predicted(start.spec)}",
    ]
    lines += warning_lines(start.findings, start.goal)
    lines += [f"  - {w}" for w in start.why]
    return lines
