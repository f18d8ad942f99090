"""The advisor after a sweep: what to try next, read from the sweep's run.json records.

Each suggestion is a runnable command line that passes the rules and that the memory estimate
predicts to fit; a suggestion that restates a rule (W001's ETP check) calls the rule's predicate.
A suggestion runs where the sweep ran: it keeps the run's overrides (cluster, model, nodes,
train_iters...) and the sweep's launcher (`-m hydra/launcher=...`, which the sweeper records in
each point.json), and a proposal to extend an axis is a sweep of it (`-m mbs=8,16`).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from moe_vlm.base.errors import BadInput
from moe_vlm.base.files import POINT_JSON, RUN_JSON
from moe_vlm.cli.advise.start import candidate, command
from moe_vlm.config.compose import compose_spec, override_key, set_overrides
from moe_vlm.config.schema import MOCK_KINDS, RecomputeGranularity
from moe_vlm.config.spec import RunSpec
from moe_vlm.data.stats import MOCK_SPEEDUP_NOTE
from moe_vlm.perf.memory import THIN_HEADROOM_FRACTION, MemoryEstimate, estimate, fits_after
from moe_vlm.record.records import Failure, RecordError, RunRecord
from moe_vlm.rules import errors
from moe_vlm.rules.guide import etp_replaceable_by_ep
from moe_vlm.rules.memory import describe_fit
from moe_vlm.runtime.points import read_json

# A component whose share of the step is at least this "dominates" it.
VISION_DOMINATES_SHARE = 0.40
# Throughput counts as still rising with MBS when the largest MBS beats the previous one by this.
MBS_RISING_MARGIN = 0.03

MOCK_DATA = frozenset(k.value for k in MOCK_KINDS)  # labelled mock: never evidence about real images


@dataclass(frozen=True)
class Suggestion:
    topic: str
    why: str
    command: str
    # The point(s) it proposes (overrides as the run's; a `key=a,b` value is an axis), and the run
    # whose cluster, model, nodes and launcher it keeps; None: a command that runs nothing new.
    overrides: tuple[str, ...] | None = None
    run: SweepRun | None = None


@dataclass
class SweepRun:
    path: Path
    record: RunRecord
    overrides: list[str]
    spec: RunSpec | None
    launcher: list[str] = field(default_factory=list)  # its sweep's hydra/launcher=..., hydra.launcher.*

    def command(self, overrides: list[str], axis: bool = False) -> str:
        """A command that runs `overrides` where this run ran: through its sweep's launcher (which
        Hydra uses only with -m), on its cluster, model and node count; axis: a value list to sweep."""
        given = {override_key(o) for o in overrides}
        kept = [f"{key}={value}" for key, value in self.identity() if key not in given]
        if not self.launcher and not axis:
            return command([*kept, *overrides])
        return "python train.py -m " + " ".join(shlex.quote(o) for o in [*self.launcher, *kept, *overrides])

    def identity(self) -> list[tuple[str, Any]]:
        """Its model, cluster and node count, which a suggestion keeps even where they were defaults."""
        if self.spec is None:
            return []
        return [
            ("model", self.spec.model.name),
            ("cluster", self.spec.cluster.name),
            ("nodes", self.spec.layout.nodes),
        ]

    @property
    def status(self) -> str:
        return self.record.status

    @property
    def data_kind(self) -> str:
        return str(self.record.knob("data") or "unknown")

    @property
    def summary(self) -> dict[str, Any]:
        return self.record.summary or {}

    @property
    def failure(self) -> Failure | None:
        return self.record.failure

    @property
    def throughput(self) -> float | None:
        value = self.summary.get("effective_tokens_per_s_per_gpu")
        return float(value) if isinstance(value, int | float) else None

    @property
    def label(self) -> str:
        return " ".join(self.overrides)

    def throughput_band(self) -> tuple[float, float] | None:
        """Effective tokens/s/GPU at the p90 and the p10 step time: the run's own noise."""
        times = self.summary.get("step_time_s")
        rate = self.throughput
        if rate is None or not isinstance(times, dict):
            return None
        values = [v for k in ("p10", "p50", "p90") if isinstance(v := times.get(k), int | float) and v > 0]
        if len(values) != 3:
            return None
        p10, p50, p90 = (float(v) for v in values)
        return rate * p50 / p90, rate * p50 / p10

    def suggest(self, topic: str, why: str, overrides: list[str], axis: bool = False) -> Suggestion:
        """A suggestion to run `overrides` where this run ran."""
        return Suggestion(topic, why, self.command(overrides, axis), tuple(overrides), self)


def load_records(root: Path) -> list[SweepRun]:
    """Every usable run under `root`; a record RunRecord.read cannot use is left out with one line
    on stderr naming the file and why (BadInput when none is left)."""
    # The report's finder (imported here: it brings pandas, which planning a first run does not need).
    from moe_vlm.report.table import find_run_files

    records = []
    found = find_run_files([str(root)])
    for path in found:
        try:
            record = RunRecord.read(path)
            overrides = point_overrides(path.parent, record)
        except RecordError as exc:
            print(exc.skipped("moe-vlm advise"), file=sys.stderr)
            continue
        try:
            spec: RunSpec | None = compose_spec(overrides)
        except Exception:  # a record from an older schema: no memory-based suggestions for it
            spec = None
        launcher = launcher_overrides(path.parent)
        records.append(SweepRun(path=path, record=record, overrides=overrides, spec=spec, launcher=launcher))
    if not records:
        raise BadInput(
            f"sweep={root}: none of its {len(found)} {RUN_JSON} file(s) is a record advise can use (each "
            "is named above with why). Fix: point sweep= at a sweep whose runs wrote their records."
        )
    return records


def point_overrides(point_dir: Path, record: RunRecord) -> list[str]:
    """A point's own overrides: Hydra's .hydra/overrides.yaml, else the sweeper's point.json (a
    rejected point never ran), else rebuilt from the recorded config."""
    overrides_file = point_dir / ".hydra" / "overrides.yaml"
    point = read_json(point_dir / POINT_JSON) or {}
    if overrides_file.is_file():
        try:
            saved = yaml.safe_load(overrides_file.read_text())
        except (OSError, ValueError, yaml.YAMLError) as exc:  # unreadable, binary, not YAML
            raise RecordError(overrides_file, f"not Hydra's overrides list ({type(exc).__name__})") from None
        if not isinstance(saved, list | None):
            raise RecordError(overrides_file, f"not Hydra's overrides list (a {type(saved).__name__})")
        overrides = [str(o) for o in saved or []]
    elif isinstance(point.get("overrides"), list):
        overrides = [str(o) for o in point["overrides"]]
    else:
        overrides = record.overrides()
    # A preset's axes are among the point's overrides; `sweep=` and hydra.* are the sweep's (its
    # launcher is kept apart: launcher_overrides).
    return [o for o in overrides if not override_key(o).startswith(("hydra", "sweep"))]


def launcher_overrides(point_dir: Path) -> list[str]:
    """The launcher a point ran through: its point.json (the sweeper records it), else the hydra
    overrides Hydra saved in .hydra/hydra.yaml; [] when it ran in process."""
    point = read_json(point_dir / POINT_JSON)
    if point is not None and isinstance(point.get("launcher_overrides"), list):
        return [str(o) for o in point["launcher_overrides"]]
    try:
        saved = yaml.safe_load((point_dir / ".hydra" / "hydra.yaml").read_text()) or {}
        given = [str(o) for o in saved["hydra"]["overrides"]["hydra"] or []]
    except (OSError, ValueError, yaml.YAMLError, KeyError, TypeError):
        return []
    return [
        o
        for o in given
        if override_key(o) == "hydra/launcher" or override_key(o).startswith("hydra.launcher.")
    ]


def _validated(overrides: list[str]) -> tuple[RunSpec, MemoryEstimate] | None:
    found = candidate(overrides)
    if found is None or errors(found[1]):
        return None
    return found[0], found[2]


def suggest_mock(records: list[SweepRun]) -> list[Suggestion]:
    mocks = [r for r in records if r.status == "completed" and r.data_kind in MOCK_DATA]
    if not mocks:
        return []
    best = max(mocks, key=lambda r: r.throughput or 0.0)
    realistic = set_overrides(best.overrides, "data=synthetic")
    twin = next((r for r in records if r.status == "completed" and measured_as(r, realistic)), None)
    if twin is not None:  # already measured on realistic images: compare, do not rerun
        return [
            Suggestion(
                "mock data used as evidence",
                f"{len(mocks)} completed run(s) used data=mock: {MOCK_SPEEDUP_NOTE}; `{best.label}` was "
                f"also measured on realistic images (`{twin.label}`): compare the two, and rank only the "
                "realistic one",
                f"moe-vlm report --diff {shlex.quote(str(twin.path.parent))} {shlex.quote(str(best.path.parent))}",
            )
        ]
    return [
        best.suggest(
            "mock data used as evidence",
            f"{len(mocks)} completed run(s) used data=mock: {MOCK_SPEEDUP_NOTE}, so their throughput "
            "says little about the VLM; rerun the best one on realistic images (mock and real results "
            "are never ranked together)",
            realistic,
        )
    ]


def suggest_oom(records: list[SweepRun]) -> list[Suggestion]:
    out = []
    for r in records:
        if r.status != "failed" or r.failure is None or r.failure.name != "oom" or r.spec is None:
            continue
        fit = fits_after(r.spec)
        if fit is None:
            continue
        out.append(
            r.suggest(
                "out of memory",
                f"`{r.label}` ran out of memory; the estimate's first change that fits: {describe_fit(fit)}",
                set_overrides(r.overrides, *shlex.split(fit.variant.overrides)),
            )
        )
    return out


def suggest_vision(records: list[SweepRun]) -> list[Suggestion]:
    dominated = [
        r
        for r in records
        if r.status == "completed"
        and r.data_kind not in MOCK_DATA
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
            r.suggest(
                "vision encoder dominates the step",
                why + "; for decoder-focused tuning freeze the vision stack (less compute and memory)",
                set_overrides(r.overrides, "vision_freeze=vision"),
            )
        )
    if r.spec is not None:
        bigger = set_overrides(r.overrides, f"mbs={r.spec.mbs * 2}")
        if _validated(bigger) is not None:
            out.append(
                r.suggest(
                    "vision encoder dominates the step",
                    f"raise MBS carefully: MBS {r.spec.mbs * 2} is predicted to fit, but the vision "
                    "path grows with it; compare effective tokens/s, not step time",
                    bigger,
                )
            )
    return out


def suggest_selective(records: list[SweepRun]) -> list[Suggestion]:
    out: list[Suggestion] = []
    full = [
        r
        for r in records
        if r.status == "completed"
        and r.data_kind not in MOCK_DATA
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
        relaxed_memory = checked[1]
        kind = str(r.summary.get("memory_kind") or "cuda_max_allocated")
        # The measured peak plus what the estimate says selective adds, on the quantity that was measured.
        delta = relaxed_memory.comparable_gib(kind) - estimate(r.spec).comparable_gib(kind)
        outside = relaxed_memory.total_gib - relaxed_memory.allocated_gib
        predicted = float(r.summary["peak_memory_gib"]) + delta + outside
        capacity = r.spec.cluster.gpu_memory_gib
        if predicted <= capacity * (1 - THIN_HEADROOM_FRACTION):
            # Only a relaxation suggested stands for its layout: a larger MBS whose selective would
            # not fit leaves the smaller MBS that would its own suggestion.
            seen.add(key)
            out.append(
                r.suggest(
                    "full recompute with headroom",
                    f"`{r.label}` peaked at {r.summary['peak_memory_gib']:.1f} GiB ({kind}) of "
                    f"{capacity:.0f} GiB "
                    f"with full recompute; selective is predicted at {predicted:.1f} GiB: relax to "
                    "selective, "
                    "the usual faster steady state",
                    relaxed,
                )
            )
    return out[:2]


def suggest_etp(records: list[SweepRun]) -> list[Suggestion]:
    out = []
    seen: set[tuple[str, ...]] = set()
    for r in records:
        if r.spec is None:
            continue
        lay = r.spec.layout
        wider = etp_replaceable_by_ep(lay, r.spec.model.num_experts)  # W001's predicate
        if wider is None:
            continue
        changed = set_overrides(r.overrides, f"ep={wider}", "etp=1")
        if tuple(changed) in seen or _validated(changed) is None:
            continue
        seen.add(tuple(changed))
        out.append(
            r.suggest(
                "ETP in use where EP alone fits",
                f"`{r.label}` uses ETP={lay.etp}; EP={wider} alone fits in memory and inside the "
                "NVLink domain. ETP adds communication and tuning surface: use it only when EP alone is not enough",
                changed,
            )
        )
    return out


def suggest_mbs(records: list[SweepRun]) -> list[Suggestion]:
    groups: dict[tuple[str, ...], list[SweepRun]] = {}
    for r in records:
        if r.status != "completed" or r.data_kind in MOCK_DATA or r.spec is None or r.throughput is None:
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
        if rate_top <= rate_prev * (1 + MBS_RISING_MARGIN) or within_noise(by_mbs[top], by_mbs[previous]):
            continue  # not rising, or rising by less than the runs' own noise (noise_lines says so)
        curve = ", ".join(f"MBS {m}: {by_mbs[m].throughput:,.0f}" for m in sorted(by_mbs))
        last = by_mbs[top]
        why = (
            f"effective tokens/s/GPU is still rising with MBS ({curve}; "
            f"+{rate_top / rate_prev - 1:.0%} at the last step): VLMs are MBS-sensitive, sweep further"
        )
        # Extend the axis: the next doublings predicted to fit, as a sweep.
        fitting: list[int] = []
        for mbs in (top * 2, top * 4):
            if _validated(set_overrides(last.overrides, f"mbs={mbs}")) is None:
                break
            fitting.append(mbs)
        if fitting:
            axis = f"mbs={','.join(str(m) for m in fitting)}"
            out.append(
                last.suggest(
                    "MBS still rising",
                    why + f"; MBS {' and '.join(str(m) for m in fitting)} predicted to fit",
                    set_overrides(last.overrides, axis),
                    axis=len(fitting) > 1,
                )
            )
            continue
        nxt = set_overrides(last.overrides, f"mbs={top * 2}")
        fit = fits_after(compose_spec(nxt))
        if fit is not None:
            out.append(
                last.suggest(
                    "MBS still rising",
                    why + f"; MBS {top * 2} needs more memory: {describe_fit(fit)}",
                    set_overrides(nxt, *shlex.split(fit.variant.overrides)),
                )
            )
    return out


def spec_key(spec: RunSpec) -> str:
    """A point's identity for "already measured": its whole RunSpec, whatever spelled it."""
    plain = {k: v for k, v in spec.to_dict().items() if k != "dry_run"}
    return json.dumps(plain, sort_keys=True, default=str)


def measured_as(run: SweepRun, overrides: list[str]) -> bool:
    """Whether `overrides`, run where `run` ran, is the point `run` measured."""
    if run.spec is None:
        return False
    try:
        return spec_key(compose_spec(overrides)) == spec_key(run.spec)
    except Exception:  # a combination Hydra rejects is no measured point
        return False


def _axis_points(overrides: tuple[str, ...]) -> list[list[str]]:
    points: list[list[str]] = [[]]
    for override in overrides:
        key, _, value = override.partition("=")
        values = value.split(",") if "," in value and not value.startswith("[") else [value]
        points = [[*point, f"{key}={v}"] for point in points for v in values]
    return points


def unmeasured(suggestion: Suggestion, measured: dict[str, SweepRun]) -> Suggestion | None:
    """The suggestion without the points the sweep already ran (an axis loses those values);
    None when every point it proposes was measured."""
    if suggestion.overrides is None or suggestion.run is None:
        return suggestion
    keep: list[list[str]] = []
    for point in _axis_points(suggestion.overrides):
        try:
            if spec_key(compose_spec(point)) in measured:
                continue
        except Exception:  # the command stays as the suggester checked it
            pass
        keep.append(point)
    if not keep:
        return None
    if len(keep) == len(_axis_points(suggestion.overrides)):
        return suggestion
    axes: dict[str, list[str]] = {}
    for point in keep:
        for override in point:
            key, _, value = override.partition("=")
            axes.setdefault(key, [])
            if value not in axes[key]:
                axes[key].append(value)
    overrides = [f"{key}={','.join(values)}" for key, values in axes.items()]
    return suggestion.run.suggest(suggestion.topic, suggestion.why, overrides, axis=len(keep) > 1)


def within_noise(a: SweepRun, b: SweepRun) -> bool:
    """Whether two runs' effective tokens/s overlap between their p10 and p90 step times."""
    band_a, band_b = a.throughput_band(), b.throughput_band()
    return band_a is not None and band_b is not None and band_a[0] <= band_b[1] and band_b[0] <= band_a[1]


def noise_lines(records: list[SweepRun]) -> list[str]:
    """Which measured differences are inside the runs' own noise: the fastest run against each
    run whose p10-p90 throughput band overlaps its own (per data class: mock is never compared)."""
    out = []
    for mock in (False, True):
        done = sorted(
            (
                r
                for r in records
                if r.status == "completed"
                and r.throughput_band() is not None
                and (r.data_kind in MOCK_DATA) == mock
            ),
            key=lambda r: r.throughput or 0.0,
            reverse=True,
        )
        if len(done) < 2:
            continue
        best, tied = done[0], [r for r in done[1:] if within_noise(done[0], r)]
        if not tied:
            continue

        def band(r: SweepRun) -> str:
            low, high = r.throughput_band() or (0.0, 0.0)
            return f"`{r.label}` {r.throughput:,.0f} ({low:,.0f}-{high:,.0f})"

        out.append(
            f"inside the noise: the fastest{' mock' if mock else ''} run {band(best)} and "
            + ", ".join(band(r) for r in tied)
            + " effective tokens/s/GPU (p10-p90 step times) overlap: their differences are not "
            "measured; rerun them with more train_iters before choosing"
        )
    return out


def after_sweep(sweep: Path, goal: str) -> list[str]:
    records = load_records(sweep)
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
    measured = {spec_key(r.spec): r for r in records if r.spec is not None and r.status != "rejected"}
    kept = [unmeasured(s, measured) for s in suggestions]
    dropped = [s for s, k in zip(suggestions, kept, strict=True) if k is None]
    suggestions = [k for k in kept if k is not None]
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    out = [
        f"== moe-vlm advise: sweep={sweep} ({len(records)} runs: {status}) goal={goal} ==",
        "",
    ]
    out += [*noise_lines(records), *([""] if noise_lines(records) else [])]
    out += [
        f"not suggested: [{s.topic}] `{' '.join(s.overrides or ())}` was already measured in this sweep"
        for s in dropped
    ]
    if not suggestions:
        out.append(
            "nothing to flag: no mock evidence, no OOM, no dominant vision encoder, no recompute or "
            "ETP to relax,"
        )
        out.append("and MBS is no longer rising. Compare the ranked results: moe-vlm report " + str(sweep))
    for number, s in enumerate(suggestions, 1):
        out += [f"{number}. [{s.topic}] {s.why}.", f"   {s.command}", ""]
    return out
