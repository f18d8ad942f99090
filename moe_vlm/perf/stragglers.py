"""Stragglers: ranks and nodes whose median step or component time is well above the job's.

One slow node ruins a 64-GPU measurement, and nothing in the ranked table shows it. From the
per-rank steps.jsonl records of the steady window (see moe_vlm.record.records), each rank gets the median
of every timed quantity; the job's median is the median over ranks, and a rank, or a node (the
ranks of one host), is flagged when its median is more than THRESHOLD times the job's, and more
than MIN_EXCESS_OF_STEP of the job's median step time above it (a projector 20% slower by a
millisecond is noise, not a straggler).

What the records can show: ranks wait for each other at every collective, so a rank slow in
compute raises every rank's step time and its peers' waits land in whichever component holds the
next collective. A flag is therefore strongest evidence where a rank's time is its own: its data
wait, and a component it computes without a collective. Every rank's medians stay in
`summary.per_rank` for the reading the flags do not settle.

`metrics.summarize` stores `rank_medians` in run.json (`summary.per_rank`); the report calls
`find` (report.table.stragglers_of_run) and `section`.
Records written before the host was recorded have `host: None`: ranks are still compared, nodes are
not.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moe_vlm.record.records import StepRecord

THRESHOLD = 1.10  # a rank or node median above this many times the job's median is flagged
MIN_EXCESS_OF_STEP = 0.01  # ... and above it by at least this share of the median step time
FLAGS_SHOWN = 6  # per run on the report's line (a whole slow node flags each of its ranks too)
STEP = "step_time_s"
DATA_WAIT = "data_wait_s"
COMPONENTS = ("vision_encoder", "projector", "decoder")  # flops.MODULES, the components_s keys
METRIC_NAMES = {
    STEP: "step",
    DATA_WAIT: "data wait",
    "vision_encoder": "vision encoder",
    "projector": "projector",
    "decoder": "decoder",
}


def _timings(record: StepRecord) -> dict[str, float]:
    """The timed quantities of one rank-step record (components only where the engine timed them)."""
    out = {STEP: float(record.step_time_s)}
    if record.data_wait_s is not None:
        out[DATA_WAIT] = float(record.data_wait_s)
    components = record.components_s or {}
    for name in COMPONENTS:
        if components.get(name) is not None:
            out[name] = float(components[name])
    return out


def _load(record: StepRecord) -> dict[str, float]:
    """What one rank processed in one step: with packing and real data it varies between ranks."""
    out = {"images": float(record.images), "real_tokens": float(record.real_tokens)}
    if record.samples is not None:
        out["samples"] = float(record.samples)
    return out


def rank_medians(steady: list[list[StepRecord]]) -> list[dict[str, Any]]:
    """Per rank over the steady steps (each a list of rank records): host, steps, median seconds,
    and the median images, real tokens and samples it processed per step (median_load)."""
    series: dict[int, dict[str, list[float]]] = {}
    loads: dict[int, dict[str, list[float]]] = {}
    hosts: dict[int, str | None] = {}
    for records in steady:
        for record in records:
            rank = int(record.rank)
            hosts[rank] = record.host or hosts.get(rank)
            for metric, seconds in _timings(record).items():
                series.setdefault(rank, {}).setdefault(metric, []).append(seconds)
            for name, count in _load(record).items():
                loads.setdefault(rank, {}).setdefault(name, []).append(count)
    return [
        {
            "rank": rank,
            "host": hosts[rank],
            "steps": len(series[rank][STEP]),
            "median_s": {metric: median(values) for metric, values in series[rank].items()},
            "median_load": {name: median(values) for name, values in loads.get(rank, {}).items()},
        }
        for rank in sorted(series)
    ]


# Where a slow rank's extra step time can be its own: waiting for data, the vision encoder, the
# decoder (projector time is within the vision tower's and small). LOAD_NAMES: what it processed.
ATTRIBUTED = (DATA_WAIT, "vision_encoder", "decoder")
LOAD_NAMES = {"images": "images", "real_tokens": "tokens", "samples": "samples"}


@dataclass(frozen=True)
class Attribution:
    """A rank's median step time above the job's, split by where its own medians are above the job's,
    beside what it processed per step against the job's median."""

    extra_s: float
    parts_s: dict[str, float]  # metric -> this rank's median minus the job's (positive parts only)
    load: dict[str, float]  # this rank's median images / real_tokens / samples per step
    job_load: dict[str, float]

    def text(self) -> str:
        parts = ", ".join(f"{METRIC_NAMES[m]} +{s:.3f} s" for m, s in self.parts_s.items()) or "no timed part"
        load = ", ".join(
            f"{self.load[name]:,.0f} {label} (job {self.job_load[name]:,.0f})"
            for name, label in LOAD_NAMES.items()
            if name in self.load and name in self.job_load
        )
        return f"extra {self.extra_s:.3f} s: {parts}" + (f"; processed {load} per step" if load else "")


def attribute(entry: dict[str, Any], per_rank: list[dict[str, Any]]) -> Attribution | None:
    """Where one rank's extra step time went: data wait, vision encoder or decoder, and its load."""
    medians = [e["median_s"] for e in per_rank]
    if STEP not in entry["median_s"]:
        return None
    job = {
        m: median(each[m] for each in medians if m in each)
        for m in (STEP, *ATTRIBUTED)
        if any(m in x for x in medians)
    }
    parts = {
        m: entry["median_s"][m] - job[m]
        for m in ATTRIBUTED
        if m in entry["median_s"] and m in job and entry["median_s"][m] > job[m]
    }
    loads = [e.get("median_load") or {} for e in per_rank]
    job_load = {
        n: median(each[n] for each in loads if n in each) for n in LOAD_NAMES if any(n in x for x in loads)
    }
    return Attribution(
        extra_s=entry["median_s"][STEP] - job[STEP],
        parts_s=dict(sorted(parts.items(), key=lambda item: -item[1])),
        load=dict(entry.get("median_load") or {}),
        job_load=job_load,
    )


@dataclass(frozen=True)
class Flag:
    who: str  # "rank 5 (node-b)" or "node node-b (ranks 4-7)"
    host: str | None
    metric: str
    seconds: float
    job_median_s: float
    attribution: Attribution | None = None  # a rank flagged on its step time: where the time went

    @property
    def ratio(self) -> float:
        return self.seconds / self.job_median_s

    def text(self) -> str:
        why = f" ({self.attribution.text()})" if self.attribution is not None else ""
        return (
            f"{self.who}: {METRIC_NAMES[self.metric]} {self.seconds:.3f} s = {self.ratio:.2f}x the job's "
            f"median {self.job_median_s:.3f} s{why}"
        )


@dataclass(frozen=True)
class Stragglers:
    ranks: int
    hosts: int  # distinct hosts recorded (0: records without a host)
    flags: list[Flag]

    @property
    def slow_nodes(self) -> str | None:
        """The hosts flagged as nodes, comma-separated (sbatch --exclude's format)."""
        return ",".join(sorted({f.host for f in self.flags if f.host and f.who.startswith("node ")})) or None

    def text(self, most: int = FLAGS_SHOWN) -> str | None:
        """The worst `most` flags on one line (None: nothing flagged)."""
        shown = "; ".join(flag.text() for flag in self.flags[:most])
        rest = len(self.flags) - most
        return (shown + (f"; +{rest} more" if rest > 0 else "")) or None


def _ranks_label(ranks: list[int]) -> str:
    ordered = sorted(ranks)
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"ranks {ordered[0]}-{ordered[-1]}"
    return "ranks " + ",".join(str(r) for r in ordered)


def find(per_rank: list[dict[str, Any]], threshold: float = THRESHOLD) -> Stragglers:
    """Ranks and nodes whose median of a timed quantity exceeds threshold x the job's median."""
    medians = [entry["median_s"] for entry in per_rank]
    hosts: dict[str, list[dict[str, Any]]] = {}
    for entry in per_rank:
        if entry.get("host"):
            hosts.setdefault(str(entry["host"]), []).append(entry)
    flags: list[Flag] = []
    if len(per_rank) < 2:
        return Stragglers(len(per_rank), len(hosts), flags)
    step_values = [m[STEP] for m in medians if STEP in m]
    floor = MIN_EXCESS_OF_STEP * median(step_values) if step_values else 0.0
    metrics = [m for m in METRIC_NAMES if sum(m in each for each in medians) >= 2]
    for metric in metrics:
        job = median(each[metric] for each in medians if metric in each)
        if job <= 0:
            continue

        def slow(seconds: float, job: float = job) -> bool:
            return seconds > threshold * job and seconds - job > floor

        slow_nodes: dict[str, float] = {}  # host -> its median, when flagged
        if len(hosts) > 1:
            for name, entries in sorted(hosts.items()):
                values = [e["median_s"][metric] for e in entries if metric in e["median_s"]]
                if values and slow(median(values)):
                    slow_nodes[name] = median(values)
                    label = _ranks_label([int(e["rank"]) for e in entries])
                    flags.append(Flag(f"node {name} ({label})", name, metric, median(values), job))
        for entry in per_rank:
            seconds = entry["median_s"].get(metric)
            host: str | None = entry.get("host")
            # A rank of a flagged node is listed only when it is slow against its own node too.
            node = slow_nodes.get(str(host)) if host else None
            if seconds is not None and slow(seconds) and (node is None or seconds > threshold * node):
                who = f"rank {entry['rank']}" + (f" ({host})" if host else "")
                why = attribute(entry, per_rank) if metric == STEP else None
                flags.append(Flag(who, host, metric, seconds, job, why))
    flags.sort(key=lambda f: (-f.ratio, f.who))
    return Stragglers(len(per_rank), len(hosts), flags)


def _count(value: Any) -> int:
    """A count from a table cell: pandas turns a missing int into NaN."""
    return int(value) if isinstance(value, int | float) and value == value else 0


def _text(value: Any) -> str | None:
    """A text cell: pandas turns a missing string into NaN, a float, and NaN is true in an `if`."""
    return value if isinstance(value, str) and value else None


def section(rows: list[dict[str, Any]], top: int) -> list[str]:
    """The report's straggler section over completed runs (table rows with the straggler columns)."""
    compared = [r for r in rows if _count(r.get("straggler_ranks")) >= 2]
    if not compared:
        return []
    flagged = [r for r in compared if _text(r.get("stragglers"))]
    lines = [
        "",
        "## Stragglers",
        "",
        f"A rank, or a node (the ranks of one host), is flagged when its median over the steady window "
        f"of step, component or data-wait time is above **{THRESHOLD:.2f}x** the job's median (the median "
        f"over ranks) and at least {MIN_EXCESS_OF_STEP:.0%} of the median step time above it. "
        f"{len(compared)} completed run(s) with 2 or more ranks checked: {len(flagged)} flagged.",
    ]
    without_host = sum(1 for r in compared if not _count(r.get("straggler_hosts")))
    if without_host:
        lines.append(f"{without_host} of them recorded no host per rank: ranks compared, nodes not.")
    if flagged:
        lines.append("")
        lines += [f"- run {r['run']}: {r['stragglers']}" for r in flagged[:top]]
    if len(flagged) > top:
        lines.append(f"+ {len(flagged) - top} more flagged runs: see the stragglers column of results.csv.")
    nodes = sorted(
        {host for r in flagged for host in (_text(r.get("straggler_nodes")) or "").split(",") if host}
    )
    if nodes:
        lines += [
            "",
            "To measure without the flagged node(s), rerun the sweep command with "
            f"`+hydra.launcher.additional_parameters.exclude={','.join(nodes)}` (sbatch --exclude).",
        ]
    return lines
