"""The run record: run.json when the run starts and when it ends, steps.jsonl while it runs.

run.json is written with temp file + fsync + rename, so a killed run never leaves a
half-written record; steps.jsonl is appended and flushed line by line, so a killed run
leaves every completed step readable.

A run writes run.json with `status: running` when it starts (host, PID, start time) and
beats heartbeat.json while it runs (moe_vlm/runtime/heartbeat.py), until the engine replaces run.json
with the final record (completed or failed). A `running` record whose process is gone was
killed without a word: SIGKILL, the OOM killer, a lost node outside Slurm. `moe-vlm status`
and `report` show it as failed, class killed (runtime/failures.py:settle_running), with the
steps it finished.

One steps.jsonl line per optimizer step per data-parallel rank (rank 0 gathers and writes them
all): a StepRecord, which both engines build from their batch counts; one run.json: a RunRecord,
which the run, the engines, the sweeper, the launcher and runtime.failures write, and report,
advise and status read. The dataclasses below are the schema, field by field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO, cast, get_args, get_origin, get_type_hints

from moe_vlm.base.files import RUN_JSON, write_json_atomic
from moe_vlm.base.provenance import environment, point_id
from moe_vlm.base.safety import scrub
from moe_vlm.config.spec import RunSpec
from moe_vlm.record.columns import (
    GROUPS,
    KNOB_KINDS,
    KNOBS,
    REBUILD_KEYS,
    SETTING_KINDS,
    SPEC_ATTR,
    identity_field,
)
from moe_vlm.record.shape import (
    BOOL,
    INT,
    NUMBER,
    REAL,
    RUN_SHAPE,
    SCALAR,
    STR,
    SURROGATE_ESCAPE,
    MapOf,
    RecordError,
    Required,
    load_json,
    not_unicode,
    problem,
)

if TYPE_CHECKING:
    from moe_vlm.data.batch import BatchStats


class Finding(Protocol):
    """What a rejected record keeps of a rules.Finding (the rules sit above the records)."""

    def to_dict(self) -> dict[str, object]: ...


class RunStatus(StrEnum):
    """run.json's `status`."""

    completed = "completed"
    failed = "failed"
    rejected = "rejected"  # by the rules, or bad input data, before any work
    running = "running"  # written at the start; replaced by the final record (heartbeat.gone: killed)
    requeued = "requeued"  # stopped by a USR2 for a requeue; the next attempt replaces it


# A record no later write of this attempt replaces: the run is over (status, pack, halving).
TERMINAL: tuple[RunStatus, ...] = (RunStatus.completed, RunStatus.failed, RunStatus.rejected)
RUNNING = RunStatus.running
# An attempt that a USR2 stopped for a requeue (launch/requeue.py); the job reruns the point.
REQUEUED = RunStatus.requeued
SCHEMA_VERSION = 1


class StepWriter:
    """Appends one JSON object per line and flushes it, so readers see every finished step."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._handle: TextIO = path.open("a", buffering=1)

    def write(self, record: StepRecord | dict[str, Any]) -> None:
        line = record.to_json() if isinstance(record, StepRecord) else record
        self._handle.write(json.dumps(line, sort_keys=True, default=str) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> StepWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_steps(path: Path) -> list[StepRecord]:
    """Every line that is a step: a torn last line from a killed writer, or a line that is no step
    of any version (not an object, a count that is not an integer, a step time that is not a finite
    number), is skipped, so whoever summarises the steps sees only measurements."""
    steps: list[StepRecord] = []
    try:
        text = path.read_bytes().decode(errors="replace")
    except OSError:
        return steps
    surrogates = SURROGATE_ESCAPE.search(text) is not None
    for line in text.splitlines():
        try:
            raw = json.loads(line)
        except (ValueError, RecursionError):  # torn, corrupt, or an integer too long to convert
            continue
        if isinstance(raw, dict) and _step_problem(raw) is None and not (surrogates and not_unicode(raw)):
            steps.append(StepRecord.from_json(raw))
    return steps


# --- typed records: one steps.jsonl line (StepRecord), one run.json (RunRecord) --------------
#
# The code is the schema: both engines build their steps.jsonl lines as StepRecords, every
# writer of run.json builds a RunRecord, and readers (metrics, stragglers, report, advise,
# status) read them back through from_json. The JSON keys are those records have always had, so
# records written before these types read the same.

TOKEN_KINDS = ("padded", "real", "text", "image", "loss")  # steps.jsonl "tokens": {kind: <kind>_tokens}
_TOKENS = {kind: f"{kind}_tokens" for kind in TOKEN_KINDS}


@dataclass(kw_only=True, slots=True)
class StepRecord:
    """One steps.jsonl line: one optimizer step of one data-parallel rank, its counts summed over
    the step's micro-batches. Both engines build it with `measured` from their data.batch.BatchStats
    counts (the Megatron engine's StepStats is one), so the count fields carry BatchStats' names; on
    disk the token counts sit under "tokens" ({"padded": padded_tokens, ...}, TOKEN_KINDS)."""

    step: int  # 1-based optimizer step
    rank: int  # data-parallel rank
    warmup: bool  # step <= warmup_steps (excluded from the steady window)
    time_unix_s: float  # wall clock at the end of the step
    # The whole optimizer step (all micro-batches): torch engine, host clock between device
    # synchronisations; Megatron, CUDA events on the current stream at step start and end (no
    # synchronise: read at the gather).
    step_time_s: float
    # Mean loss over this rank's micro-batches (Megatron: Bridge's reduced loss, from this DP
    # rank's last pipeline stage, token-weighted over the global batch for Qwen3-VL:
    # megatron/bridge/training/train.py:980-992).
    loss: float | None
    grad_norm: float | None  # global gradient norm (same on every rank)
    lr: float | None  # learning rate used
    micro_batches: int  # accumulation steps run
    # This rank, summed over micro-batches (data.batch.BatchStats has what each one counts).
    sequences: int
    padded_tokens: int
    real_tokens: int
    text_tokens: int
    image_tokens: int
    loss_tokens: int
    images: int
    vision_patches: int
    sum_seq_len_squared: int
    sum_patches_squared: int
    # Peak on this rank: torch engine, since the run started; Megatron, within this step
    # (torch.cuda.reset_peak_memory_stats at its start), the max over the DP rank's model-parallel
    # peers. The max over lines is the run's peak.
    peak_memory_gib: float | None
    memory_kind: str | None  # a metrics.MemoryKind: "cuda_max_allocated" (GPU), "process_peak_rss" (CPU)
    components_s: dict[str, float] | None  # {"vision_encoder", "projector", "decoder"}: forward + backward s
    # Host seconds of step_time_s the training loop waited for batches (torch engine: building
    # them in its loop; Megatron: inside next(data_iterator)).
    data_wait_s: float | None
    # Fields with a default are absent from a line when None (an engine that does not measure
    # them, or a line written before they existed):
    host: str | None = None  # the process that measured it
    # From this step's start to the next step's start: step_time_s plus what the training loop
    # runs before the next step (Bridge: training_log with its barrier and tracker writes,
    # train.py:633, manual GC, :725-729, checkpointing; torch engine: the gather, steps.jsonl,
    # console and tracker). Same clock as step_time_s. None on the last step (no next start).
    step_period_s: float | None = None
    # Why this step is outside the steady window besides warm-up ("profiler", "checkpoint",
    # "cuda_graph_capture", "skipped_iter").
    exclude: str | None = None
    # Samples the data pipeline dropped while building this step's batches (Megatron: seeded draws
    # it replaced; real data skips happen inside Energon).
    skipped_samples: int | None = None
    # Samples in this step's sequences (more than `sequences` when rows are packed, data.packing).
    samples: int | None = None
    # Torch engine: the two halves of components_s (with timing hooks on), and the seconds of
    # step_time_s in grad norm + optimizer step (collectives included).
    components_forward_s: dict[str, float] | None = None
    components_backward_s: dict[str, float] | None = None
    optimizer_s: float | None = None
    # Megatron, read at the step's end, max over the DP rank's model-parallel peers:
    # torch.cuda.memory_reserved (the caching allocator's segments), and cudaMemGetInfo total -
    # free (the whole GPU, as nvidia-smi shows it; minus reserved_gib, what lives outside the
    # allocator: CUDA context, NCCL, DeepEP/HybridEP and TE userbuffer buffers).
    reserved_gib: float | None = None
    device_used_gib: float | None = None
    # Bridge's FLOP count for the step, and it over the slowest rank's step time, per GPU.
    bridge_step_flops: float | None = None
    bridge_tflops_per_gpu: float | None = None
    # Keys this version does not know (a newer writer's): kept, so a round trip loses nothing.
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def measured(cls, counts: BatchStats, **fields: Any) -> StepRecord:
        """A line from a step's counts: every BatchStats field (of `counts`' class, so StepStats'
        micro_batches and data_wait_s too) that a line carries, by name; `fields` the rest."""
        carried = {f.name: getattr(counts, f.name) for f in dataclass_fields(counts) if f.name in _STEP_NAMES}
        return cls(**(carried | fields))

    def to_json(self) -> dict[str, Any]:
        line: dict[str, Any] = {name: getattr(self, name) for name in _STEP_PLAIN}
        line["tokens"] = {kind: getattr(self, name) for kind, name in _TOKENS.items()}
        for name in _STEP_OPTIONAL:
            value = getattr(self, name)
            if value is not None:
                line[name] = value
        return self.extra | line

    @classmethod
    def from_json(cls, line: Mapping[str, Any], strict: bool = False) -> StepRecord:
        """A line as written, or as written by an older version (a missing count reads 0, a missing
        figure None). `strict`: every field present with its type and no unknown key, as a line
        this version writes must be; ValueError names what is wrong."""
        tokens = line.get("tokens") or {}
        if strict:
            _check_line(line, tokens)
        missing = [name for name in _STEP_REQUIRED if name not in line]
        if missing:
            raise ValueError(f"steps.jsonl line without {', '.join(missing)}: {dict(line)}")
        get = line.get  # a run's lines read in seconds per 100,000: keep this loop lean
        values = {name: get(name, absent) for name, absent in _STEP_READ}
        for kind, name in _TOKENS.items():
            values[name] = tokens.get(kind, 0)
        known = line.keys() <= _STEP_KEYS
        extra = {} if known else {key: value for key, value in line.items() if key not in _STEP_KEYS}
        return cls(**values, extra=extra)


_STEP_FIELDS = [f for f in dataclass_fields(StepRecord) if f.name != "extra"]
_STEP_NAMES = frozenset(f.name for f in _STEP_FIELDS)
_STEP_OPTIONAL = tuple(f.name for f in _STEP_FIELDS if f.default is None)
_STEP_REQUIRED = ("step", "step_time_s")  # every line has them, whatever version wrote it
# The fields written as they are, always (the token counts go under "tokens").
_STEP_PLAIN = _STEP_REQUIRED + tuple(
    f.name for f in _STEP_FIELDS if f.name not in (*_STEP_REQUIRED, *_STEP_OPTIONAL, *_TOKENS.values())
)
_STEP_KEYS = frozenset({*_STEP_PLAIN, *_STEP_OPTIONAL, "tokens"})
# What an older line lacks reads as: nothing counted on rank 0, outside warm-up; no figure.
_STEP_ABSENT: dict[str, Any] = {
    "rank": 0,
    "warmup": False,
    "micro_batches": 0,
    "sequences": 0,
    "images": 0,
    "vision_patches": 0,
    "sum_seq_len_squared": 0,
    "sum_patches_squared": 0,
}
_STEP_READ = tuple((name, _STEP_ABSENT.get(name)) for name in (*_STEP_PLAIN, *_STEP_OPTIONAL))


def _json_types(hint: Any) -> tuple[type, ...]:
    """The JSON value types a field annotation allows (an int is a valid float; a bool is no int)."""
    out: list[type] = []
    for option in get_args(hint) or (hint,):
        origin = get_origin(option) or option
        if origin is float:
            out += [float, int]
        elif origin is type(None):
            out.append(type(None))
        else:
            out.append(origin)
    return tuple(out)


_STEP_TYPES = {
    name: _json_types(hint) for name, hint in get_type_hints(StepRecord).items() if name != "extra"
}


def _check_line(line: Mapping[str, Any], tokens: Any) -> None:
    problems = [f"missing {name}" for name in _STEP_PLAIN if name not in line]
    problems += [f"unknown key {key}" for key in line if key not in _STEP_KEYS]
    if not isinstance(tokens, dict) or set(tokens) != set(TOKEN_KINDS):
        problems.append(f"tokens must be {{{', '.join(TOKEN_KINDS)}}}, not {tokens!r}")
    else:
        problems += [f"tokens.{k} is {v!r}" for k, v in tokens.items() if type(v) is not int]
    for name in (*_STEP_PLAIN, *_STEP_OPTIONAL):
        if name in line:
            value, allowed = line[name], _STEP_TYPES[name]
            if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
                problems.append(f"{name} is {type(value).__name__} {value!r}")
    if problems:
        raise ValueError(f"not a steps.jsonl line of this version: {'; '.join(problems)}")


# What a line read from disk must be for StepRecord and its readers (metrics, stragglers): each
# field it has of its declared type, numbers finite and in range; missing fields read as absent.
_STEP_SHAPE: dict[str, Any] = {
    **{
        name: (
            NUMBER if float in types else INT if int in types else STR if str in types
            else BOOL if bool in types else MapOf(NUMBER)
        )
        for name, types in _STEP_TYPES.items()
        if name not in _TOKENS.values()
    },
    "step": Required(INT),
    "step_time_s": Required(NUMBER),
    **dict.fromkeys(("loss", "grad_norm", "lr"), REAL),
    "tokens": MapOf(INT),
}  # fmt: skip


# Fields a line has always had a value for (a missing one reads as _STEP_ABSENT; null is no count).
_STEP_NOT_NULL = frozenset(name for name, types in _STEP_TYPES.items() if type(None) not in types)


def _step_problem(line: Mapping[str, Any]) -> str | None:
    for name in _STEP_REQUIRED:
        if line.get(name) is None:
            return f"{name} is missing"
    for name, value in line.items():  # only the keys a line has: a lean loop
        shape = _STEP_SHAPE.get(name)
        if shape is None:
            continue  # an unknown key: StepRecord.extra keeps it
        if value is None:
            if name in _STEP_NOT_NULL:
                return f"{name} is null"
            continue
        found = problem(value, shape, name)
        if found:
            return found
    return None


def as_step(line: StepRecord | Mapping[str, Any]) -> StepRecord:
    return line if isinstance(line, StepRecord) else StepRecord.from_json(line)


@dataclass(frozen=True)
class Failure:
    """run.json's `failure`: why a run failed (or was rejected for its input data)."""

    name: str  # on disk "class": a runtime.failures class (oom, nccl, ...), or "invalid" (bad data)
    message: str
    evidence: str | None = None  # the log line that decided the class
    log_tail: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"class": self.name, "message": self.message}
        if self.evidence is not None:
            out["evidence"] = self.evidence
        if self.log_tail is not None:
            out["log_tail"] = self.log_tail
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Failure:
        tail = raw.get("log_tail")
        return cls(
            name=str(raw.get("class") or "unknown"),
            message=str(raw.get("message") or ""),
            evidence=raw.get("evidence"),
            log_tail=list(tail) if isinstance(tail, list) else None,
        )


# run.json's `layout`: a view of spec.layout, kept for readers of the JSON that predate the spec.
LAYOUT_VIEW = ("world_size", "nodes", "dp", "tp", "pp", "vp", "cp", "ep", "etp")
_RUN_KEYS = frozenset(
    {"schema_version", "status", "point_id", "config", "spec", "layout", "engine", "data", "env",
     "summary", "findings", "failure", "launch"}
)  # fmt: skip


def _kind_of(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _dig(value: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


@dataclass
class RunRecord:
    """One run.json. Writers build it with a constructor (new, rejected, completed, failed, and
    with_failure / with_launch on one read back) and `write` it; readers get it from `read` or
    `from_json` and ask `knob`, `setting`, `overrides`, `status`, `failure`, `summary`."""

    status: str  # a RunStatus (kept as written when a record says something else)
    config: dict[str, Any] = field(default_factory=dict)  # the resolved Hydra config, secrets masked
    spec: dict[str, Any] | None = None  # RunSpec.to_dict(); None: written without one
    point_id: str | None = None  # the config + code identity (point_id)
    engine: str | None = None  # the resolved engine
    data: dict[str, Any] = field(default_factory=dict)  # {"kind", "routing"}; torch engine: + "stats"
    env: dict[str, Any] = field(default_factory=dict)  # versions, git state, host, Slurm job
    summary: dict[str, Any] | None = None  # metrics.summarize of the steps; None: no steps to summarise
    findings: list[dict[str, Any]] = field(default_factory=list)  # rules.Finding.to_dict()
    failure: Failure | None = None
    launch: dict[str, Any] = field(default_factory=dict)  # where and how the job ran (launcher, failures)
    # What one writer adds: torch_engine, bridge, process (a running record), tracker (the experiment
    # tracker logged, or failed: where and why; record/explog.py Tracker), fixture, ...
    sections: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    # --- writing

    @classmethod
    def new(cls, spec: RunSpec, config: dict[str, Any], status: str, **sections: Any) -> RunRecord:
        env = environment()
        return cls(
            status=status,
            config=config,
            spec=spec.to_dict(),
            point_id=point_id(config, env["git"]["commit"]),
            engine=spec.engine.value,
            # Forced-balance routing is labelled beside the data kind: neither is a real-routing VLM run.
            data={"kind": spec.data.kind.value, "routing": spec.router.name},
            env=env,
            sections=sections,
        )

    @classmethod
    def rejected(
        cls,
        spec: RunSpec,
        config: dict[str, Any],
        findings: Iterable[Finding] = (),
        invalid: str | None = None,
    ) -> RunRecord:
        """Rejected before any work: by the rules (`findings`), or for its input data (`invalid`)."""
        record = cls.new(spec, config, RunStatus.rejected)
        record.findings = [f.to_dict() for f in findings]
        if invalid is not None:
            record.failure = Failure("invalid", invalid)
        return record

    @classmethod
    def completed(
        cls,
        spec: RunSpec,
        config: dict[str, Any],
        summary: dict[str, Any],
        data_stats: dict[str, Any] | None = None,
        **sections: Any,
    ) -> RunRecord:
        """A completed run; `summary` is metrics.summarize of its steps (metrics reads StepRecord from here)."""
        record = cls.new(spec, config, RunStatus.completed, **sections)
        record.summary = summary
        if data_stats is not None:
            record.data["stats"] = data_stats
        return record

    @classmethod
    def failed(
        cls,
        spec: RunSpec,
        config: dict[str, Any],
        summary: dict[str, Any] | None = None,
        **sections: Any,
    ) -> RunRecord:
        """A failed run, with the steps it finished summarised (`summary`, metrics.summarize; None
        without steps). with_failure says why: classified against what run.json holds by then
        (runtime.failures.failed_record)."""
        record = cls.new(spec, config, RunStatus.failed, **sections)
        record.summary = summary
        return record

    def with_failure(self, failure: Failure, launch: Mapping[str, Any] | None = None) -> RunRecord:
        return replace(self.with_launch(launch or {}), status=RunStatus.failed, failure=failure)

    def with_launch(self, launch: Mapping[str, Any]) -> RunRecord:
        return replace(self, launch={**self.launch, **launch})

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema_version": self.schema_version, "status": str(self.status)}
        out["config"] = self.config
        if self.point_id is not None:
            out["point_id"] = self.point_id
        if self.spec is not None:
            out["spec"] = self.spec
            layout = self.spec.get("layout")
            if isinstance(layout, dict):
                out["layout"] = {key: layout.get(key) for key in LAYOUT_VIEW}
        if self.engine is not None:
            out["engine"] = self.engine
        if self.summary is not None:
            out["summary"] = self.summary
        for key in ("data", "env", "findings", "launch"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.failure is not None:
            out["failure"] = self.failure.to_json()
        # Secrets from the environment (a path through ${oc.env:...}) must not reach any record.
        return cast(dict[str, Any], scrub(self.sections | out))

    def write(self, run_dir: Path) -> dict[str, Any]:
        payload = self.to_json()
        write_json_atomic(run_dir / RUN_JSON, payload)
        return payload

    # --- reading

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> RunRecord:
        """A run.json as written, by this version or an older one; ValueError naming the value
        when it is not a run record its readers can use (RUN_SHAPE, KNOB_KINDS, SETTING_KINDS)."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"a run record is a JSON object, not {_kind_of(raw)}")
        for key, shape in RUN_SHAPE.items():
            found = problem(raw.get(key), shape, key)
            if found:
                raise ValueError(found)
        spec = raw.get("spec")
        sections = {key: value for key, value in raw.items() if key not in _RUN_KEYS}
        if "layout" in raw and not (spec and "layout" in spec):
            sections["layout"] = raw["layout"]  # from before the spec: kept as it was written
        failure = raw.get("failure")
        record = cls(
            status=raw["status"],
            config=raw.get("config") or {},
            spec=spec,
            point_id=raw.get("point_id"),
            engine=raw.get("engine"),
            data=raw.get("data") or {},
            env=raw.get("env") or {},
            summary=raw.get("summary"),
            findings=list(raw.get("findings") or []),
            failure=Failure.from_json(failure) if failure is not None else None,
            launch=raw.get("launch") or {},
            sections=sections,
            schema_version=raw.get("schema_version") or SCHEMA_VERSION,
        )
        record._check_knobs()
        return record

    def _check_knobs(self) -> None:
        for name, value in self.knobs().items():
            found = problem(value, KNOB_KINDS.get(name, SCALAR if name == "engine" else STR), f"knob {name}")
            if found:
                raise ValueError(found)
        for path, kind in SETTING_KINDS.items():
            found = problem(self.setting(*path), kind, ".".join(path))
            if found:
                raise ValueError(found)

    @classmethod
    def read(cls, path: Path) -> RunRecord:
        """The one reader of run.json: `path` a run directory or its run.json. RecordError (the file
        and why, one line) for a record its readers cannot use: missing, unreadable, binary, not
        JSON, nested too deep, or a value of the wrong type where a reader needs it."""
        file = path / RUN_JSON if path.is_dir() else path
        raw = load_json(file)
        try:
            return cls.from_json(raw)
        except ValueError as exc:
            raise RecordError(file, str(exc)) from None

    @classmethod
    def of(cls, record: RunRecord | Mapping[str, Any]) -> RunRecord:
        return record if isinstance(record, RunRecord) else cls.from_json(record)

    def knobs(self, names: Iterable[str] = KNOBS) -> dict[str, Any]:
        """KNOBS values: each from the spec, else the config (None when the record has neither)."""
        view = {"spec": self.spec, "config": self.config, "engine": self.engine, **self.sections}
        out: dict[str, Any] = {}
        for name in names:
            for path in KNOBS[name]:
                out[name] = value = _dig(view, path)
                if value is not None:
                    break
        return out

    def knob(self, name: str) -> Any:
        return self.knobs((name,))[name]

    def setting(self, *path: str) -> Any:
        """A config value by its Hydra path (`cluster`, `gpu`): the RunSpec's, else the config's."""
        group = SPEC_ATTR.get(path[0], path[0])
        value = _dig(self.spec, (group, *path[1:]))
        return value if value is not None else _dig(self.config, path)

    def overrides(self) -> list[str]:
        """Overrides that rebuild this run from its config (when its .hydra/overrides.yaml is gone)."""
        recipe, row = _dig(self.config, ("recipe", "name")), _dig(self.config, ("card", "row"))
        out = [f"recipe={recipe}"] if recipe not in (None, "none") else []  # the rest override it
        out += [f"card={row}"] if row not in (None, "none") else []  # and its published figure comes back
        for group in GROUPS:
            value = _dig(self.config, (group, identity_field(group)))
            if value is not None:
                out.append(f"{group}={value}")
        path = _dig(self.config, ("data", "path"))
        if path:
            out.append(f"data.path={path}")
        for key in REBUILD_KEYS:
            value = self.config.get(key)
            if value is not None and not (key == "engine" and value == "auto"):
                out.append(f"{key}={value}")
        return out

    def error_codes(self) -> list[str]:
        return [str(f.get("code")) for f in self.findings if f.get("level") == "error"]

    def reason(self) -> str | None:
        """Why the run did not complete, in one line (None when nothing says)."""
        if self.failure is not None:
            return f"{self.failure.name}: {self.failure.message}".strip()
        errors = [f for f in self.findings if f.get("level") == "error"]
        return "; ".join(f"{f.get('code')} {f.get('message') or ''}".strip() for f in errors) or None


def base_record(spec: RunSpec, config: dict[str, Any], status: str) -> dict[str, Any]:
    """A run.json as JSON, for code that edits a record as JSON (tests, fixtures, benchmarks)."""
    return RunRecord.new(spec, config, status).to_json()
