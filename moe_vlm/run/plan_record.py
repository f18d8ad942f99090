"""plan.json: the dry run's plan, machine-readable.

`python train.py ... dry_run=true` writes it in the run directory beside `.hydra/`; a sweep's dry
run writes one per point in `<sweep dir>/<point id>/plan.json`. It holds what the printed plan
shows, as values: the knobs (every group's choice and the top-level knobs) and the resolved
RunSpec, the layout, the memory terms, the findings with their codes, the FLOPs basis (Bridge's
logged count beside ours, moe_vlm/perf/flops_basis.py), and on the Megatron engine the recipe, every
field the engine sets, the stack probe and Bridge's effective configuration after its runtime
update (when built: a big sweep's dry run leaves those out, and says so).

Typed (`Plan` and its parts are dataclasses), written with the project's atomic writer, and
versioned: `read_plan` refuses a file of another schema version with one line naming it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from moe_vlm.base.files import write_atomic
from moe_vlm.config.schema import Engine
from moe_vlm.config.spec import RunSpec
from moe_vlm.knobs.bridge_fields import bridge_overrides
from moe_vlm.knobs.bridge_recipe import select_recipe
from moe_vlm.perf.flops_basis import BasisTerm, FlopsBasis
from moe_vlm.perf.memory import MemoryEstimate
from moe_vlm.record.columns import choices
from moe_vlm.rules import Finding
from moe_vlm.run.plan import SHALLOW_NOTE, Gathered

PLAN_JSON = "plan.json"
PLAN_SCHEMA_VERSION = 1


class PlanError(ValueError):
    """A plan.json this reader cannot use: one line naming the file and why."""


@dataclass(frozen=True)
class PlanFinding:
    code: str
    level: str  # error | warning
    keys: list[str]
    message: str
    fix: str
    title: str = ""


@dataclass(frozen=True)
class PlanTerm:
    name: str
    gib: float
    detail: str
    allocator: bool  # counted by torch.cuda.max_memory_allocated


@dataclass(frozen=True)
class PlanMemory:
    engine: str
    device: str
    peak_stage: str
    capacity_gib: float | None
    total_gib: float
    allocated_gib: float
    headroom_gib: float | None
    fits: bool | None
    terms: list[PlanTerm]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PlanModule:
    """One module the run imports, as the stack probe found it here."""

    label: str
    imports: str
    version: str | None
    ok: bool
    error: str | None


@dataclass(frozen=True)
class PlanField:
    """One row of moe_vlm/knobs/bridge_fields.py as this point sets it."""

    knob: str
    field: str
    value: Any
    why: str


@dataclass(frozen=True)
class PlanBridge:
    recipe: str | None
    family: str | None
    fields: list[PlanField]
    stack: list[PlanModule] | None  # None: not probed (see stack_note)
    stack_note: str
    effective: dict[str, Any] | None  # run.json's bridge.effective shape; None: not built (effective_note)
    effective_note: str


@dataclass(frozen=True)
class Plan:
    schema_version: int
    verdict: str  # VALID | INVALID
    engine: str
    knobs: dict[str, Any]
    spec: dict[str, Any]
    memory: PlanMemory | None
    memory_note: str | None  # why there is no estimate
    findings: list[PlanFinding]
    flops_basis: FlopsBasis | None
    flops_basis_note: str | None  # why there is no basis before the run
    bridge: PlanBridge | None  # engine=megatron only
    prediction: dict[str, Any] | None = None  # moe_vlm.predict.model.Prediction.to_json()
    prediction_note: str | None = None  # why there is no prediction
    # What the libraries printed while the plan ran their checks (warnings, log lines): kept here,
    # off the console (moe_vlm/base/noise.py captured).
    library_output: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return self.verdict == "VALID"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Plan:
        memory, basis, bridge = payload["memory"], payload["flops_basis"], payload["bridge"]
        return cls(
            **{
                **payload,
                "memory": None
                if memory is None
                else PlanMemory(**{**memory, "terms": [PlanTerm(**t) for t in memory["terms"]]}),
                "findings": [PlanFinding(**f) for f in payload["findings"]],
                "flops_basis": None if basis is None else _basis(basis),
                "bridge": None if bridge is None else _bridge(bridge),
            }
        )

    def write(self, run_dir: Path, clean: Callable[[Any], Any]) -> Path:
        """Atomically, through `clean` (the caller's secret scrubber: a data path may hold one)."""
        path = run_dir / PLAN_JSON
        # Compact: json's C encoder (indent= falls back to the pure-Python one, 6x the CPU over a
        # 1,000-point dry run); `python -m json.tool plan.json` prints it indented.
        write_atomic(path, json.dumps(clean(self.to_json()), separators=(",", ":"), sort_keys=True) + "\n")
        return path


def _basis(payload: dict[str, Any]) -> FlopsBasis:
    names = {f.name for f in dataclasses.fields(FlopsBasis)}
    values = {k: v for k, v in payload.items() if k in names}  # real/useful fractions are derived
    return FlopsBasis(**{**values, "terms": tuple(BasisTerm(**t) for t in values["terms"])})


def _bridge(payload: dict[str, Any]) -> PlanBridge:
    stack = payload["stack"]
    return PlanBridge(
        **{
            **payload,
            "fields": [PlanField(**f) for f in payload["fields"]],
            "stack": None if stack is None else [PlanModule(**m) for m in stack],
        }
    )


def read_plan(path: Path) -> Plan:
    """A plan.json, or PlanError naming the file and why (another schema version, not a plan)."""
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path}: not readable as JSON ({exc})") from None
    version = payload.get("schema_version") if isinstance(payload, dict) else None
    if version != PLAN_SCHEMA_VERSION:
        raise PlanError(
            f"{path}: plan schema version {version!r}, this reader reads {PLAN_SCHEMA_VERSION}; "
            "plan the point again with dry_run=true"
        )
    try:
        return Plan.from_json(payload)
    except (KeyError, TypeError) as exc:
        raise PlanError(f"{path}: not a plan ({type(exc).__name__}: {exc})") from None


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def _memory(found: MemoryEstimate) -> PlanMemory:
    return PlanMemory(
        engine=str(found.engine),
        device=found.device,
        peak_stage=found.peak_stage,
        capacity_gib=found.capacity_gib,
        total_gib=found.total_gib,
        allocated_gib=found.allocated_gib,
        headroom_gib=found.headroom_gib,
        fits=found.fits,
        terms=[PlanTerm(t.name, t.gib, t.detail, t.allocator) for t in found.terms],
        notes=list(found.notes),
    )


def _bridge_of(spec: RunSpec, got: Gathered, invalid: bool) -> PlanBridge:
    recipe = select_recipe(spec)
    fields = [PlanField(o.knob, o.field, _json_safe(o.value), o.why or "") for o in bridge_overrides(spec)]
    why_not = "not checked: the plan is INVALID" if invalid else SHALLOW_NOTE
    stack, stack_note = None, why_not
    if got.stack is not None:
        probes, entry = got.stack
        stack = [
            PlanModule(
                p.module.label, p.module.statement(), p.version, p.ok, None if p.ok else f"{p.error}{p.where}"
            )
            for p in probes
        ]
        stack_note = entry.note()
    effective: dict[str, Any] | None = None
    effective_note = why_not
    if isinstance(got.effective, str):
        effective_note = f"not built here: {got.effective}"
    elif got.effective is not None:
        planned, entry = got.effective
        effective, effective_note = _json_safe(planned.effective.to_record()), entry.note()
    return PlanBridge(
        recipe=recipe.name if recipe else None,
        family=recipe.family if recipe else None,
        fields=fields,
        stack=stack,
        stack_note=stack_note,
        effective=effective,
        effective_note=effective_note,
    )


def plan_of(
    spec: RunSpec, findings: list[Finding], got: Gathered, library_output: list[str] | None = None
) -> Plan:
    """The typed plan of one point, from the values its printed plan shows."""
    invalid = any(f.is_error for f in findings)
    resolved = spec.to_dict()
    knobs = {
        **choices(spec),
        **{k: resolved[k] for k in ("mbs", "gbs", "seq_length", "train_iters", "seed", "lr")},
        "nodes": spec.layout.nodes,
        "engine": spec.engine.value,
    }
    return Plan(
        schema_version=PLAN_SCHEMA_VERSION,
        verdict="INVALID" if invalid else "VALID",
        engine=spec.engine.value,
        knobs=knobs,  # RunSpec.to_dict: plain values already (enums as their values)
        spec=resolved,
        memory=None if isinstance(got.memory, str) else _memory(got.memory),
        memory_note=got.memory if isinstance(got.memory, str) else None,
        findings=[
            PlanFinding(f.code, f.level.value, list(f.keys), f.message, f.fix, f.title) for f in findings
        ],
        flops_basis=None if isinstance(got.basis, str) else got.basis,
        flops_basis_note=got.basis if isinstance(got.basis, str) else None,
        bridge=_bridge_of(spec, got, invalid) if spec.engine == Engine.megatron else None,
        prediction=None if isinstance(got.prediction, str) else got.prediction.to_json(),
        prediction_note=got.prediction if isinstance(got.prediction, str) else None,
        library_output=list(library_output or []),
    )
