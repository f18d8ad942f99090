"""Dry-run rendering: what a run would do, without doing it."""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moe_vlm.config.precision import profile as precision_profile
from moe_vlm.config.schema import Engine
from moe_vlm.config.spec import RunSpec
from moe_vlm.data.workers import data_workers
from moe_vlm.engines.hf_config import is_local_checkpoint
from moe_vlm.knobs.bridge_fields import RESOLVED_FIELDS, bridge_overrides, forward_step_path
from moe_vlm.knobs.bridge_recipe import select_recipe
from moe_vlm.knobs.cards import plan_lines as card_lines
from moe_vlm.knobs.recipes import plan_lines as recipe_lines
from moe_vlm.perf.flops_basis import FlopsBasis, basis_lines, expected_basis
from moe_vlm.perf.memory import MemoryEstimate, estimate
from moe_vlm.perf.memory.micro_batch import micro_batch_shape
from moe_vlm.perf.peaks import peak_of, precision_peak_of
from moe_vlm.predict.model import Prediction, predict
from moe_vlm.record.columns import choices
from moe_vlm.rules import Finding, Level, unplannable
from moe_vlm.rules.shapes import NOT_RUN, shape_findings
from moe_vlm.rules.shapes import applies as shapes_apply

# The Megatron engine's planning (engines/megatron: its plan cache, the library checks, the shape
# check) is imported by the functions below that use it, which only a Megatron point calls: a torch
# point's dry run does not pay for it (docs/configuration.md, Start-up).
if TYPE_CHECKING:
    from moe_vlm.engines.megatron.effective import Planned
    from moe_vlm.engines.megatron.library_checks import LibraryFinding
    from moe_vlm.engines.megatron.plan_cache import Entry
    from moe_vlm.engines.megatron.stack import Probe

SHALLOW_ENV = "MOE_VLM_PLAN_SHALLOW"
SHALLOW_NOTE = (
    "not built in a big dry run (seconds per point): plan this point alone, or rerun the sweep with "
    "dry_run=full"
)


def _fmt(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, default=repr)  # a KEEP entry prints as "(recipe's)"
    return str(value)


def routing_line(spec: RunSpec) -> str:
    if spec.router.force_load_balancing:
        return (
            "routing        FORCED BALANCE: random router logits, every expert equally loaded whatever the "
            "data (MCore: benchmark only); reports label it and never rank it with real routing"
        )
    return "routing        real: the router's own logits choose the experts"


def precision_line(spec: RunSpec) -> str:
    fmt, profile = spec.precision.format, precision_profile(spec.precision.format)
    how = (
        f"Bridge {profile.bridge_recipe}"
        if spec.engine == Engine.megatron
        else "torch: bf16 on GPUs, fp32 on CPU"
    )
    peaks = dict.fromkeys(p["name"] for p in (peak_of(spec), precision_peak_of(spec)) if p["name"])
    mfu = f"MFU vs {' and vs '.join(peaks)}" if peaks else "no MFU: the cluster declares no peak"
    return f"precision      {fmt.value} ({profile.label}; {how}); {mfu}"


def layout_lines(spec: RunSpec) -> list[str]:
    lay = spec.layout
    nvlink = "inside" if lay.ep_tp_inside_nvlink else "OUTSIDE"
    gbs_note = " (model default, rounded to a multiple of MBS x DP)" if spec.gbs_is_default else ""
    return [
        f"world size     {lay.world_size} = {lay.nodes} node(s) x {lay.ranks_per_node} rank(s)/node",
        f"model parallel TP={lay.tp} PP={lay.pp} VP={lay.vp} CP={lay.cp}  ->  DP={lay.dp}",
        f"experts        EP={lay.ep}{' (auto)' if lay.ep_auto else ''} ETP={lay.etp}  ->  expert DP={lay.expert_dp}"
        f"  ({spec.model.num_experts} experts, {spec.model.num_experts // max(lay.ep, 1)} per rank)",
        f"NVLink         EP x TP = {lay.ep_tp_group} ranks, {nvlink} the {lay.nvlink_domain_gpus}-GPU domain; "
        f"job spans {lay.nvlink_domains_spanned} domain(s)",
        f"batch          GBS={spec.gbs}{gbs_note} = MBS {spec.mbs} x DP {lay.dp} x {spec.accumulation_steps} "
        f"accumulation step(s); seq_length={spec.seq_length}",
        f"micro-batch    {micro_batch_shape(spec).text()}",
        f"data workers   {data_workers(spec).describe()}",
        routing_line(spec),
        precision_line(spec),
    ]


def megatron_lines(spec: RunSpec) -> list[str]:
    """The Bridge recipe and every field the engine sets on it (THE table, row by row)."""
    recipe = select_recipe(spec)
    if recipe is None:
        return ["-- Megatron Bridge --", f"recipe         none for model arch {spec.model.arch}"]
    note = f"; {recipe.note}" if recipe.note else ""
    source = (
        f"local checkpoint dir {spec.model.hf_model_id}"
        if is_local_checkpoint(spec.model)
        else f"config.json materialised offline from model={spec.model.name} (no hub access)"
    )
    overrides = bridge_overrides(spec)
    lines = [
        "-- Megatron Bridge --",
        f"recipe         {recipe.name} ({recipe.kind}{note})",
        f"recipe family  {recipe.family}: the same on every cluster of this model",
        f"hf config      {source}",
        f"forward step   {forward_step_path(spec).replace(':', '.')}, one process per GPU",
        f"fields         {len(overrides)} rows of moe_vlm/knobs/bridge_fields.py (knob -> field = value; "
        "(recipe's) = left as the recipe set it):",
    ]
    for o in overrides:
        why = f"   # {o.why}" if o.why else ""
        lines.append(f"  {o.knob:<40} {o.field:<48} = {_fmt(o.value)}{why}")
    return lines


def probed_stack(spec: RunSpec) -> tuple[list[Probe], Entry]:
    """Every module this run imports, tried here (seconds: it loads Megatron; cached after, see
    moe_vlm/engines/megatron/plan_cache.py); engine=megatron only."""
    from moe_vlm.engines.megatron.plan_cache import stack_probe

    return stack_probe(spec)


def stack_lines(spec: RunSpec, probed: tuple[list[Probe], Entry] | None = None) -> list[str]:
    probes, entry = probed_stack(spec) if probed is None else probed
    missing = [p for p in probes if not p.ok]
    verdict = (
        "every module imports here"
        if not missing
        else f"{len(missing)} of {len(probes)} do not import here: a run on this machine stops before "
        "distributed init (exit 2); the cluster's container must hold them"
    )
    lines = ["-- stack (what each rank imports; checked again on every node before distributed init) --"]
    seen: set[str | None] = set()
    for found in probes:
        lines += found.lines(detail=found.error not in seen)
        seen.add(found.error)
    return [*lines, verdict, entry.note()]


def library_missing(spec: RunSpec) -> str | None:
    """Why the library the configuration is built with (Megatron Core, TE, Bridge) does not import
    here, from the plan cache's stack probe; None when it imports. A build without it raises only
    after importing transformers and torch (tens of seconds on a login node) and is never cached, so
    every plan there would pay them again."""
    from moe_vlm.engines.megatron.stack import LIBRARY, half_installed

    probes, _entry = probed_stack(spec)
    missing = [p for p in probes if p.module in LIBRARY and not p.ok]
    if not missing:
        return None
    half = half_installed(missing)
    return half.line() if half is not None else f"{missing[0].module.label}: {missing[0].error}"


def planned_effective(spec: RunSpec) -> tuple[Planned, Entry] | str:
    """This point's effective configuration on its recipe family (seconds the first time, from the
    plan cache after) and where it came from, or why it was not built."""
    missing = library_missing(spec)
    if missing is not None:
        return f"the Megatron stack does not import here ({missing})"
    from moe_vlm.engines.megatron.plan_cache import planned_effective as cached

    try:
        return cached(spec)
    except Exception as exc:  # no stack here, or a recipe this Bridge lacks: the plan says so and goes on
        return f"{type(exc).__name__}: {exc}"


def library_findings(spec: RunSpec) -> list[Finding]:
    """The library's own checks of this point (moe_vlm/engines/megatron/library_checks.py, seconds):
    an error per refusal, a warning when they could not run here; [] off the Megatron engine."""
    if spec.engine != Engine.megatron:
        return []
    from moe_vlm.engines.megatron.library_checks import Check
    from moe_vlm.engines.megatron.plan_cache import library_checks

    try:
        found, _entry = library_checks(spec)
    except Exception as exc:  # a recipe this Bridge lacks: the checks did not run, and the plan says so
        return [
            Finding(
                Check.stack.value,
                Level.warning,
                ("engine",),
                f"the library checks did not run: {type(exc).__name__}: {exc}",
                "see the stack lines below",
            )
        ]
    return _as_findings(found)


# What a plan cannot run without Transformer Engine, and what it runs all the same.
WITHOUT_TE = (
    "skipped here: the library's own checks (LIB-*), the shape check (S...) and Bridge's effective "
    "configuration (the canary runs them on the cluster's stack); the rules, the memory estimate and the "
    "step-time prediction ran"
)


def library_side(spec: RunSpec) -> list[Finding]:
    """The checks that run the library: its own checks, then the shape check. Where a half-installed
    Transformer Engine stops both, one warning names the broken install, the fix and what was skipped
    in place of their two. A refusal of the library's that a shape rule reports with the point's own
    micro-batch (TE's userbuffer fill: LIB-TE-UB on the buffers Bridge sizes, S004 on the batch) is
    said once, by the shape rule."""
    shaped = shape_check(spec)
    if shaped:
        from moe_vlm.engines.megatron.shape_check import shape_evidence

        explained = [v.error for v in shape_evidence(spec).refused]
        library = [f for f in library_findings(spec) if not any(error in f.message for error in explained)]
    else:
        library = library_findings(spec)
    found = [*library, *shaped]
    from moe_vlm.engines.megatron.library_checks import Check

    if not any(f.code == Check.stack.value for f in found):
        return found
    from moe_vlm.engines.megatron.stack import half_installed

    half = half_installed(probed_stack(spec)[0])
    if half is None:
        return found
    kept = [f for f in found if f.code not in (Check.stack.value, NOT_RUN)]
    return [
        *kept,
        Finding(Check.stack.value, Level.warning, ("engine",), f"{half.cause()}; {WITHOUT_TE}.", half.fix),
    ]


def stored_library_findings(spec: RunSpec) -> list[Finding] | None:
    """`library_findings(spec)` when the plan cache holds this point's checks; None when they would
    have to run (a sweep hands those to its worker process, run/library_worker.py)."""
    if spec.engine != Engine.megatron:
        return []
    from moe_vlm.engines.megatron.plan_cache import stored_library_checks

    try:
        stored = stored_library_checks(spec)
    except Exception:  # library_findings words what went wrong when the checks are asked for
        return None
    return None if stored is None else _as_findings(stored[0])


def _as_findings(found: list[LibraryFinding]) -> list[Finding]:
    return [
        Finding(
            f.check.value,
            Level.error if f.refuses else Level.warning,
            ("engine",),
            f"{f.message}{f.where}",
            f.fix,
        )
        for f in found
    ]


def shape_check(spec: RunSpec) -> list[Finding]:
    """The shape check of this point (docs/shapes.md): one real micro-batch, each rank's GEMM operands,
    Transformer Engine's own checks on them; cached per shape, so a sweep builds one batch per shape.
    [] off the Megatron engine. The canary runs the same two calls on the cluster's stack."""
    if not shapes_apply(spec):
        return []
    from moe_vlm.engines.megatron.shape_check import shape_evidence

    return shape_findings(spec, shape_evidence(spec))


def shape_lines(spec: RunSpec) -> list[str]:
    from moe_vlm.engines.megatron.shape_check import shape_evidence

    found = shape_evidence(spec)
    if found.shapes is None:
        return ["-- shape check --", f"not run: {found.not_run}"]
    checked = (
        f"Transformer Engine's checks on {found.checked} operand(s): {len(found.refused)} refused"
        if found.checked
        else "no quantized GEMM: nothing of TE's asserts applies"
    )
    return ["-- shape check (docs/shapes.md) --", found.shapes.text(), checked]


# The tuning block: the knobs whose null keeps the recipe's value, and the host-memory/HSDP ones.
TUNING_GROUPS = ("fusion", "router", "overlap", "offload", "gc")
TUNING_KNOBS = (
    "parallelism.dp_outer",
    "parallelism.dp_outer_sharding",
    "cuda_graph.vision",
    "cuda_graph.vision_scope",
    "cuda_graph.vision_max_seq_length",
)


def tuning_lines(spec: RunSpec, planned: Planned | str | None = None) -> list[str]:
    """Fusions, router, overlap, HSDP, offload, GC and vision graphs in one block: each knob, and
    the value each of its Bridge fields holds after Bridge's runtime update when it was built here."""
    table = planned.effective.table if planned is not None and not isinstance(planned, str) else {}
    rows: dict[str, list[Any]] = {}
    for o in bridge_overrides(spec):
        if o.knob.split(".")[0] in TUNING_GROUPS or o.knob in TUNING_KNOBS:
            rows.setdefault(o.knob, []).append(o)
    how = (
        "-> the value after Bridge's runtime update"
        if table
        else "fields as the table sets them; dry_run on a machine with the Megatron stack shows what each resolves to"
    )
    lines = [
        f"-- tuning: fusions, router, overlap, HSDP, offload, GC, vision graphs (null = the recipe's; {how}) --"
    ]
    for knob, found in rows.items():
        group, _, name = knob.partition(".")
        value = getattr(getattr(spec, group), name)
        shown = "null (recipe's)" if value is None else _fmt(getattr(value, "value", value))
        fields = ", ".join(
            [f"{o.field}={_fmt(table[o.field]) if o.field in table else _fmt(o.value)}" for o in found]
            + [f"{f}={_fmt(table[f])}" for f in RESOLVED_FIELDS.get(knob, ()) if f in table]
        )
        lines.append(f"  {knob:<34} {shown:<16} -> {fields}")
    return lines


def effective_lines(spec: RunSpec, found: tuple[Planned, Entry] | str | None = None) -> list[str]:
    """Bridge's configuration after its own runtime update, on CPU, and what differs across the
    recipe family (moe_vlm/engines/megatron/effective.py); engine=megatron with the stack installed."""
    title = (
        "-- effective configuration: Bridge's runtime_config_update run here as one rank on "
        f"{spec.cluster.name} would; the fields that differ from the library defaults --"
    )
    found = planned_effective(spec) if found is None else found
    if isinstance(found, str):
        return [title, f"not built here: {found}"]
    planned, entry = found
    return [
        title,
        entry.note(),
        *planned.effective.lines(),
        "",
        f"-- recipe family {planned.recipe.family}: this point on each of its perf recipes --",
        *planned.family_lines(),
    ]


def memory_of(spec: RunSpec, findings: list[Finding] | None = None) -> MemoryEstimate | str:
    """The memory estimate, or why there is none (a layout the rules reject, a point with no shape)."""
    blocked = unplannable(findings or [])
    if blocked:
        return blocked
    try:
        return estimate(spec)
    except (ArithmeticError, ValueError, IndexError) as exc:
        return str(exc)


def memory_lines(spec: RunSpec, memory: MemoryEstimate | str | None = None) -> list[str]:
    """The per-rank memory breakdown and the headroom against the cluster's GPU memory."""
    found = memory_of(spec) if memory is None else memory
    if isinstance(found, str):
        return ["-- memory --", f"not estimated: {found} (see the findings)"]
    return found.lines()


def prediction_of(spec: RunSpec, findings: list[Finding] | None = None) -> Prediction | str:
    """The predicted step time (moe_vlm/predict), or why there is none (a layout the rules reject, a
    point with no shape)."""
    blocked = unplannable(findings or [])
    if blocked:
        return blocked
    try:
        return predict(spec)
    except (ArithmeticError, ValueError, IndexError) as exc:
        return str(exc)


def prediction_lines(spec: RunSpec, found: Prediction | str | None = None) -> list[str]:
    found = prediction_of(spec) if found is None else found
    if isinstance(found, str):
        return ["-- predicted speed --", f"not predicted: {found} (see the findings)"]
    return found.lines(full=True)


def prediction_cell(found: Prediction | str) -> str:
    """A point's predicted step time and effective tokens/s/GPU in one cell of a big dry run."""
    if isinstance(found, str) or found.step_time_s is None:
        return "-"
    tokens = found.effective_tokens_per_s_per_gpu or 0.0
    return f"{found.step_time_s:.3g} s +-{found.sigma:.0%}, {tokens:,.0f} tok/s"


POINT_LINE_HEADER = (
    f"{'verdict':<8}  {'predicted peak memory':<34}  {'resources':<14}  {'rules':<22}  "
    f"{'predicted step, eff tok/s/GPU':<32}"
)


def point_line(
    spec: RunSpec,
    findings: list[Finding],
    memory: MemoryEstimate | str,
    prediction: Prediction | str | None = None,
) -> str:
    """A point of a big dry run in one line (POINT_LINE_HEADER's columns): valid or rejected, the
    rule codes (errors, then warnings in lower case), the predicted peak memory and headroom, and
    the resources it asks for."""
    bad = sorted({f.code for f in findings if f.is_error})
    warned = sorted({f.code.lower() for f in findings if not f.is_error})
    if isinstance(memory, str):
        peak = "not estimated"
    elif memory.capacity_gib is not None and memory.headroom_fraction is not None:
        peak = f"{memory.total_gib:.1f} of {memory.capacity_gib:.0f} GiB ({memory.headroom_fraction:+.0%} headroom)"
    else:
        peak = f"{memory.total_gib:.2f} GiB per rank"
    lay = spec.layout
    unit = "GPU" if spec.cluster.is_gpu_cluster else "rank"
    resources = f"{lay.nodes}x{lay.ranks_per_node} {unit}s"
    codes = ",".join([*bad, *warned]) or "-"
    speed = prediction_cell(prediction_of(spec) if prediction is None else prediction)
    return f"{'REJECTED' if bad else 'valid':<8}  {peak:<34}  {resources:<14}  {codes:<22}  {speed:<32}"


@dataclass(frozen=True)
class Gathered:
    """Everything a plan shows that takes work to find, found once: the text (render) and plan.json
    (moe_vlm/run/plan_record.py) are written from the same values."""

    memory: MemoryEstimate | str
    basis: FlopsBasis | str
    prediction: Prediction | str
    deep: bool
    stack: tuple[list[Probe], Entry] | None = None  # engine=megatron, valid, deep
    effective: tuple[Planned, Entry] | str | None = None  # the same


def gather(
    spec: RunSpec,
    findings: list[Finding],
    deep: bool = True,
    memory: MemoryEstimate | str | None = None,
    prediction: Prediction | str | None = None,
) -> Gathered:
    """deep=False leaves out what takes seconds per point on the Megatron engine (the stack probe,
    Bridge's effective configuration): a big dry run writes every plan. MOE_VLM_PLAN_SHALLOW=1 does
    the same for every plan (tests/unit/test_docs_commands.py plans every documented command this
    way; tests/megatron checks the Bridge-built sections)."""
    deep = deep and os.environ.get(SHALLOW_ENV) != "1"
    found = memory_of(spec, findings) if memory is None else memory
    blocked = unplannable(findings)
    basis = blocked or expected_basis(spec)
    speed = prediction_of(spec, findings) if prediction is None else prediction
    if spec.engine != Engine.megatron or any(f.is_error for f in findings) or not deep:
        # An invalid plan never runs: skip the seconds of importing Megatron to probe its stack.
        return Gathered(found, basis, speed, deep)
    return Gathered(found, basis, speed, deep, probed_stack(spec), planned_effective(spec))


def render(
    spec: RunSpec,
    findings: list[Finding],
    deep: bool = True,
    memory: MemoryEstimate | str | None = None,
    prediction: Prediction | str | None = None,
    gathered: Gathered | None = None,
) -> str:
    """The whole plan (gather's values, found here unless given)."""
    got = gather(spec, findings, deep, memory, prediction) if gathered is None else gathered
    # Every config group's choice (columns.GROUPS), then the top-level knobs.
    knobs = [
        *textwrap.wrap(" ".join(f"{group}={choice}" for group, choice in choices(spec).items()), 110),
        f"engine={spec.engine} (requested {spec.engine_requested}) nodes={spec.layout.nodes} mbs={spec.mbs} "
        f"gbs={spec.gbs} seq_length={spec.seq_length} train_iters={spec.train_iters} seed={spec.seed}",
    ]
    out = [
        "== moe_vlm plan ==",
        "",
        "-- knobs --",
        *knobs,
        *recipe_lines(spec, [f.code for f in findings if f.is_error]),
        *card_lines(spec),
        "",
    ]
    blocked = unplannable(findings)
    if blocked:  # the verdict before anything that assumes a point exists (the micro-batch sampler)
        out += ["-- findings --", *(f.line() for f in findings), ""]
        return "\n".join([*out, f"not planned: {blocked}", "", *verdict_lines(findings)])
    out += ["-- layout --", *layout_lines(spec), ""]
    out += [*memory_lines(spec, got.memory), ""]
    out += [*prediction_lines(spec, got.prediction), ""]
    out += [*basis_lines(spec, got.basis), ""]
    errors = [f for f in findings if f.is_error]
    out.append(f"-- findings: {len(errors)} error(s), {len(findings) - len(errors)} warning(s) --")
    out += [f.line() for f in findings] or ["none"]
    out.append("")
    if spec.engine == Engine.megatron:
        if errors:
            stack = ["-- stack --", "not checked: the plan is INVALID"]
        elif not got.deep:
            stack = ["-- stack and effective configuration --", SHALLOW_NOTE]
        else:
            stack = stack_lines(spec, got.stack)
        found = got.effective
        planned = found[0] if isinstance(found, tuple) else found
        out += [*megatron_lines(spec), "", *tuning_lines(spec, planned), "", *stack]
        if not errors:
            out += ["", *shape_lines(spec)]
        if found is not None:
            out += ["", *effective_lines(spec, found)]
    else:
        out += [
            "-- torch engine --",
            "transformers Qwen3VLMoeForConditionalGeneration + torch FSDP2 "
            f"({spec.parallelism.sharding_strategy.value}), {spec.layout.world_size} rank(s)",
        ]
    return "\n".join([*out, "", *verdict_lines(findings)])


def verdict_lines(findings: list[Finding]) -> list[str]:
    """The plan's last lines: the verdict, with every finding again in one short line (code, the
    rule's title, the fix), since the full lines sit far above the Megatron sections."""
    bad = [f for f in findings if f.is_error]
    if not findings:
        return ["VALID"]
    head = (
        f"INVALID: {len(bad)} error(s), {len(findings) - len(bad)} warning(s); nothing was run or submitted:"
        if bad
        else f"VALID, with {len(findings)} warning(s):"
    )
    return [head, *(f"  {f.brief()}" for f in findings)]


# A plan printed by default fits one screen of 40 lines: 36 here, and the first time the stack is
# checked, up to 3 progress lines on stderr (tests/unit/test_plan_summary.py counts both).
SUMMARY_LINES = 36
PLAN_TEXT = "plan.txt"  # the whole plan, as dry_run=full prints it, beside plan.json


def _memory_summary(found: MemoryEstimate | str) -> str:
    if isinstance(found, str):
        return f"memory         not estimated: {found}"
    largest = sorted(found.terms, key=lambda t: -t.bytes)[:3]
    terms = ", ".join(f"{t.name} {t.gib:.2f}" for t in largest)
    where = "GPU" if found.device == "gpu" else "rank (peak RSS)"
    if found.capacity_gib is None:
        return f"memory         {found.total_gib:.2f} GiB per {where}; largest: {terms} GiB"
    verdict = "FITS" if found.fits else "DOES NOT FIT"
    return (
        f"memory         {found.total_gib:.2f} of {found.capacity_gib:.1f} GiB per {where} -> {verdict} "
        f"({found.headroom_fraction or 0.0:.0%} headroom); largest: {terms} GiB"
    )


def _prediction_summary(found: Prediction | str) -> list[str]:
    if isinstance(found, str) or found.step_time_s is None:
        return [f"predicted      not predicted: {found if isinstance(found, str) else found.note}"]
    tokens = found.effective_tokens_per_s_per_gpu
    mfu = "no MFU (no peak declared)" if found.mfu is None else f"MFU {found.mfu:.1%} vs {found.peak_name}"
    return [
        f"predicted      step {found.step_time_s:.4g} s {found.range_text(found.step_time_s, '.4g', ' s')}"
        + ("" if tokens is None else f", {tokens:,.0f} effective tokens/s/{found.unit}"),
        f"               {mfu}; {found.source}",
        # What the number does not model or how far it is trusted (routing, an uncalibrated
        # family), next to it: the whole plan's prediction section has the rest.
        *(f"               {line}" for line in (found.note or "").splitlines()),
        f"               {len(found.not_modelled)} knob(s) not modelled (dry_run=full lists them); "
        "why one point beats another: moe-vlm explain A B",
    ]


def _megatron_summary(spec: RunSpec, findings: list[Finding], got: Gathered) -> list[str]:
    recipe = select_recipe(spec)
    lines = [f"bridge recipe  {recipe.name if recipe else 'none for model arch ' + spec.model.arch}"]
    if recipe is not None:
        lines.append(
            f"               {len(bridge_overrides(spec))} fields set from moe_vlm/knobs/bridge_fields.py"
        )
    if any(f.is_error for f in findings):
        return [*lines, "stack          not checked: the plan is INVALID"]
    if not got.deep or got.stack is None:
        return [*lines, f"stack          {SHALLOW_NOTE}"]
    probes, _entry = got.stack
    missing = [p for p in probes if not p.ok]
    from moe_vlm.engines.megatron.stack import half_installed  # the stack's own module: no import

    half = half_installed(missing)
    lines.append(
        f"stack          every one of {len(probes)} modules imports here"
        if not missing
        else f"stack          Transformer Engine is half-installed here (LIB-STACK names the fix): {len(missing)} of "
        f"{len(probes)} modules do not import"
        if half is not None
        else f"stack          {len(missing)} of {len(probes)} modules do not import here "
        f"({', '.join(p.module.label for p in missing)}): a run here stops before distributed init; "
        "the cluster's container must hold them"
    )
    effective = got.effective
    lines.append(
        "effective      not built here: Transformer Engine is half-installed (LIB-STACK)"
        if half is not None
        else f"effective      not built here: {effective}"[:200]
        if isinstance(effective, str)
        else "effective      Bridge's configuration after its runtime update: built here (see the whole plan)"
    )
    return lines


def summary(
    spec: RunSpec,
    findings: list[Finding],
    got: Gathered,
    where: str,
    library_output: int = 0,
) -> str:
    """The plan on one screen (at most SUMMARY_LINES lines): the knobs, layout, memory, prediction,
    the findings in brief, where the whole plan is, and the verdict; render() is the whole plan
    (dry_run=full prints it, plan.txt holds it). `where`: the run directory holding plan.json."""
    knobs = [
        *textwrap.wrap(" ".join(f"{group}={choice}" for group, choice in choices(spec).items()), 110),
        f"engine={spec.engine} nodes={spec.layout.nodes} mbs={spec.mbs} gbs={spec.gbs} "
        f"seq_length={spec.seq_length} train_iters={spec.train_iters}",
    ]
    out = ["== moe_vlm plan (the whole plan: dry_run=full) ==", *knobs]
    recipe, card = recipe_lines(spec), card_lines(spec)
    if recipe:
        out += [
            recipe[0],
            *(line for line in recipe[1:2] if "this run changes" in line or "every knob" in line),
        ]
    if card:
        out += card[:2]
    blocked = unplannable(findings)
    if blocked:
        out.append(f"not planned: {blocked}")
    else:
        lay = spec.layout
        nvlink = (
            f"; EP x TP {'inside' if lay.ep_tp_inside_nvlink else 'OUTSIDE'} NVLink"
            if spec.cluster.is_gpu_cluster
            else ""
        )
        out += [
            f"layout         {lay.world_size} rank(s) = {lay.nodes} node(s) x {lay.ranks_per_node}; "
            f"TP={lay.tp} PP={lay.pp} VP={lay.vp} CP={lay.cp} DP={lay.dp}; EP={lay.ep} ETP={lay.etp}{nvlink}",
            f"batch          GBS={spec.gbs} = MBS {spec.mbs} x DP {lay.dp} x {spec.accumulation_steps} "
            f"accumulation step(s); seq_length={spec.seq_length}",
            _memory_summary(got.memory),
            *_prediction_summary(got.prediction),
        ]
        if not isinstance(got.basis, str):
            out.append(f"flops basis    {got.basis.lines()[0].strip()}")
        if spec.engine == Engine.megatron:
            out += _megatron_summary(spec, findings, got)
    if library_output:
        out.append(
            f"library        {library_output} line(s) of library output kept in plan.json (library_output)"
        )
    out.append(f"plan           {where}/plan.json (values), {where}/{PLAN_TEXT} (the whole plan as text)")
    verdict = verdict_lines(findings)
    room = SUMMARY_LINES - len(out) - 1
    if len(verdict) > room:  # very many findings: the rest are in plan.json and plan.txt
        verdict = [*verdict[: room - 1], f"  ... and {len(verdict) - room + 1} more in plan.txt"]
    return "\n".join([*out, "", *verdict])
