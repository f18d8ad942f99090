"""The plan's Megatron sections, cached on disk: only the first plan of a configuration pays.

`dry_run=true` on the Megatron engine imports the stack to check it (`stack.probe`, seconds) and
builds the point's ConfigContainer on every perf recipe of its family and runs Bridge's runtime
update on each (`effective.plan_effective`, seconds per recipe). Both are pure functions of what
this module puts in their key, so a plan keeps them in a JSON file per key and the next plan of
the same configuration reads it instead (milliseconds):

- the stack probe: the modules the run imports (`stack.required`), the interpreter, every
  distribution on its import path with its version and when its metadata directory was written
  (installing, upgrading or reinstalling anything changes the key; a file written beside them,
  such as a run's outputs/ next to the editable install's egg-info in the repository, does not),
  and the project's code that decides the list and judges versions;
- the effective configuration and the family table: the RunSpec (every field but `dry_run`),
  the install as above (megatron-core, megatron-bridge, Transformer Engine, torch and
  transformers among it), the interpreter, the environment variables Bridge's update or the
  libraries it calls read (ENV_PREFIXES, as the process started), and the project's code that
  builds them (the modules `effective`, `config` and `bridge_fields` import, transitively, by
  content).

Where: $MOE_VLM_CACHE_DIR, else $XDG_CACHE_HOME/moe_vlm, else ~/.cache/moe_vlm (`plan/` below
it). Each entry is written atomically (files.write_atomic); one that does not parse, or whose
stored key differs from the one asked for, is ignored and rebuilt. A build that raised (no stack
here) is not kept, nor is an entry that would hold a secret. Deleting the directory rebuilds
everything. What a rank checks before distributed init (`stack.stack_problem`) and what a run
records (`bridge.effective`) never come from here: they run in the job's own environment.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moe_vlm.base import noise
from moe_vlm.base.distributions import metadata_dirs, versions_of
from moe_vlm.base.files import write_atomic
from moe_vlm.base.inputs import CACHE_DIR_ENV, ENV_PATHS, env_path
from moe_vlm.base.safety import scrub
from moe_vlm.config.spec import RunSpec
from moe_vlm.engines.megatron.effective import Planned, plan_effective
from moe_vlm.engines.megatron.library_checks import Check, LibraryFinding, check_point
from moe_vlm.engines.megatron.stack import Probe, probe, required
from moe_vlm.knobs.bridge_recipe import family_recipes

CACHE_ENV = CACHE_DIR_ENV
FORMAT = 1  # bumped when an entry's layout changes
# The libraries a note names (every installed distribution is in the key).
LIBRARIES = ("megatron-core", "megatron-bridge", "transformer-engine", "torch", "transformers")
# Environment variables that can change what Bridge's runtime update leaves: it reads NCCL_ALGO
# and CUDA_DEVICE_MAX_CONNECTIONS (megatron/bridge/training/config.py:1058, 1102) and
# NVTE_CPU_OFFLOAD_V1 (:2055), Megatron Core reads PYTORCH_CUDA_ALLOC_CONF
# (megatron/core/distributed/distributed_data_parallel_config.py:257), Transformer Engine and
# torch read their own NVTE_* / TORCH_* at import. Other names are ours or the shell's.
ENV_PREFIXES = ("NVTE_", "NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "NVSHMEM_", "MEGATRON", "TE_")
# The modules whose code (with everything they import) builds each section.
EFFECTIVE_ROOTS = (
    "moe_vlm.engines.megatron.effective",
    "moe_vlm.engines.megatron.config",
    "moe_vlm.knobs.bridge_fields",
)
STACK_ROOTS = ("moe_vlm.engines.megatron.stack",)
LIBRARY_ROOTS = ("moe_vlm.engines.megatron.library_checks", *EFFECTIVE_ROOTS)
_PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the directory holding moe_vlm/
# `from moe_vlm.x import (a, b)`, `from moe_vlm.x import a, b` or `import moe_vlm.x`, at any indent.
_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+(moe_vlm[\w.]*)[ \t]+import[ \t]+(?:\(([\w\s,]+)\)|([\w \t,]+))"
    r"|import[ \t]+(moe_vlm[\w.]*))",
    re.M,
)


def cache_dir() -> Path:
    explicit = env_path(CACHE_ENV, ENV_PATHS[CACHE_ENV])
    if explicit is not None:
        return explicit
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "moe_vlm"


# --- what a key is made of -------------------------------------------------------------------


@dataclass(frozen=True)
class Install:
    """What is installed on the import path."""

    versions: dict[str, str]  # distribution -> version, the first on sys.path winning
    # sha256 over (metadata directory, its mtime in ns) for every distribution on the path: pip
    # makes a new metadata directory on each install, so a reinstall of the same version changes
    # it. Not the mtimes of the directories holding them: the repository root holds the editable
    # install's egg-info and is written by anything run there (a run's outputs/, a test's files).
    stamp: str


@functools.cache
def installed() -> Install:
    """Read from the metadata directories' names (as importlib.metadata resolves them): one
    listing per path entry and one stat per distribution, not one metadata search each."""
    found = list(metadata_dirs())
    digest = hashlib.sha256()
    for one in found:
        try:
            written = os.stat(os.path.join(one.entry or ".", one.item)).st_mtime_ns
        except OSError:
            continue
        digest.update(f"{one.entry}\0{one.item}\0{written}\0".encode())
    return Install(versions_of(found), digest.hexdigest())


def library_versions() -> dict[str, str | None]:
    versions = installed().versions
    return {name: versions.get(name) for name in LIBRARIES}


@functools.cache
def _project_modules() -> dict[str, str]:
    """Every module of the moe_vlm package by dotted name -> its source file."""
    modules: dict[str, str] = {}
    for folder, _, files in os.walk(_PACKAGE_ROOT / "moe_vlm"):
        package = os.path.relpath(folder, _PACKAGE_ROOT).replace(os.sep, ".")
        for name in files:
            if name.endswith(".py"):
                stem = name[:-3]
                modules[package if stem == "__init__" else f"{package}.{stem}"] = os.path.join(folder, name)
    return modules


@functools.cache
def _parsed(module: str) -> tuple[bytes, tuple[str, ...]]:
    """A project module's source and the project modules it imports (anywhere in the file)."""
    modules = _project_modules()
    with open(modules[module], "rb") as handle:
        source = handle.read()
    imported: list[str] = []
    for package, grouped, names, plain_import in _IMPORT.findall(source.decode()):
        if plain_import:
            imported.append(plain_import)
            continue
        imported.append(package)
        for name in (grouped or names).split(","):
            if f"{package}.{name.strip()}" in modules:  # `from moe_vlm import explog`: a module
                imported.append(f"{package}.{name.strip()}")
    return source, tuple(imported)


@functools.cache
def code_modules(*roots: str) -> dict[str, bytes]:
    """The sources of `roots` (module names) and of every project module they import,
    transitively (at module level or inside functions), with their packages' __init__ files."""
    modules = _project_modules()
    seen: dict[str, bytes] = {}
    todo = list(roots)
    while todo:
        parts = todo.pop().split(".")
        for depth in range(1, len(parts) + 1):  # a module runs its packages' __init__ first
            module = ".".join(parts[:depth])
            if module in seen or module not in modules:
                continue
            seen[module], imported = _parsed(module)
            todo += imported
    return seen


@functools.cache
def code_version(*roots: str) -> str:
    """sha256 over code_modules(*roots)."""
    digest = hashlib.sha256()
    for module, source in sorted(code_modules(*roots).items()):
        digest.update(module.encode() + b"\0" + source + b"\0")
    return digest.hexdigest()


def _environment(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES)}


@dataclass(frozen=True)
class Keying:
    """What a process computes its keys with: the environment and the install."""

    environment: dict[str, str]
    install: Install


# The environment as this process found it, before the libraries imported here set their own
# (Transformer Engine sets NVTE_CUDA_INCLUDE_DIR at import): a plan that reads the stack check from
# the cache imports nothing, and must compute the same key as one that imported the stack first.
_STARTED_WITH = _environment(os.environ)
_keyed_as: Keying | None = None  # key_like's; None: this process's own


def keying() -> Keying:
    """The environment and the install this process's keys are computed with."""
    return _keyed_as or Keying(_STARTED_WITH, installed())


def key_like(other: Keying) -> None:
    """Compute keys as another process does: a worker checking a sweep's points
    (run/library_worker.py) inherits the sweep's environment as it is when the worker starts, which
    a library imported in between may have added to, and would read the install anew, after
    anything that rewrote a metadata directory meanwhile (`pip install --dry-run -e .` rewrites the
    project's egg-info); its entries must be the ones the sweep's process looks up."""
    global _keyed_as
    _keyed_as = other


def _spec_key(spec: RunSpec) -> dict[str, Any]:
    fields = asdict(spec)
    fields.pop("dry_run")
    return fields


# --- entries ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """Where one section came from: the cache (hit) or a build that was then stored."""

    what: str  # what the entry holds, for people
    path: Path
    hit: bool
    built_unix_s: float
    libraries: dict[str, str | None]
    stored: bool = True  # False: built, but not kept (it held a secret, or the directory is read-only)

    def note(self) -> str:
        built = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.built_unix_s))
        libraries = ", ".join(f"{name} {version or '-'}" for name, version in self.libraries.items())
        if self.hit:
            return (
                f"(from the plan cache: {self.what} built {built} for these inputs with {libraries}; "
                f"{self.path}; ${CACHE_ENV} moves the cache, deleting the file rebuilds it)"
            )
        if not self.stored:
            return (
                f"(built now, not cached: {self.what} holds a secret, or {self.path.parent} is not writable)"
            )
        return f"(built now with {libraries}; cached at {self.path} for the next plan of this configuration)"


def _key(parts: dict[str, Any]) -> tuple[str, str]:
    text = json.dumps({"format": FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest(), text


@dataclass(frozen=True)
class _Slot:
    """Where the entry for one set of inputs lives, and the key it must carry."""

    key: str
    text: str  # the inputs as JSON, stored beside the payload
    path: Path


def _slot(kind: str, parts: dict[str, Any]) -> _Slot:
    key, text = _key(parts)
    return _Slot(key, text, cache_dir() / "plan" / f"{kind}-{key[:32]}.json")


def entry_path(kind: str, parts: dict[str, Any]) -> Path:
    """Where the entry for these inputs lives (kind: "stack", "effective" or "library")."""
    return _slot(kind, parts).path


def _read(path: Path, key: str) -> dict[str, Any] | None:
    """The stored entry, or None when absent, unreadable, not this key's or not this format's."""
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key or entry.get("format") != FORMAT:
        return None
    if not isinstance(entry.get("built_unix_s"), float | int):
        return None
    return entry


def _lookup[T](what: str, slot: _Slot, load: Callable[[Any], T]) -> tuple[T, Entry] | None:
    """What an earlier build stored for these inputs; None when there is none (or it is damaged)."""
    entry = _read(slot.path, slot.key)
    if entry is None:
        return None
    try:
        return load(entry["payload"]), Entry(
            what, slot.path, True, float(entry["built_unix_s"]), library_versions()
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # a damaged entry: the caller builds it again


def _cached[T](
    what: str,
    kind: str,
    parts: dict[str, Any],
    build: Callable[[], T],
    codec: tuple[Callable[[T], Any], Callable[[Any], T]],
    progress: str,
    keep: Callable[[T], bool] = lambda _value: True,
) -> tuple[T, Entry]:
    """build(), or what an earlier build stored for the same inputs. codec: (dump, load), between
    the value and its JSON form; a value `keep` refuses is returned, not stored."""
    dump, load = codec
    slot = _slot(kind, parts)
    found = _lookup(what, slot, load)
    if found is not None:
        return found
    key, text, path = slot.key, slot.text, slot.path
    libraries = library_versions()
    print(  # to the console even while a plan captures the library's output (base/noise.py)
        f"moe_vlm: {progress} (first time for this configuration; cached after)",
        file=noise.progress(),
        flush=True,
    )
    value = build()
    built = time.time()
    blob = {
        "format": FORMAT,
        "key": key,
        "inputs": json.loads(text),
        "built_unix_s": built,
        "payload": dump(value),
    }
    # An entry never holds a secret (the value of a secret environment variable): one that would is not kept.
    stored = keep(value) and scrub(blob) == blob
    if stored:
        try:
            write_atomic(path, json.dumps(blob, indent=1) + "\n")
        except (OSError, TypeError, ValueError):
            stored = False
    return value, Entry(what, path, False, built, libraries, stored)


# --- the two sections ------------------------------------------------------------------------


def _python() -> dict[str, Any]:
    found = keying().install
    return {
        "executable": sys.executable,
        "version": sys.version,
        "installed": found.versions,
        "install_stamp": found.stamp,
    }


def stack_inputs(spec: RunSpec) -> dict[str, Any]:
    """Everything the stack probe's result depends on."""
    return {
        "modules": [asdict(m) for m in required(spec)],
        **_python(),
        "code": code_version(*STACK_ROOTS),
    }


def stack_probe(spec: RunSpec) -> tuple[list[Probe], Entry]:
    """`stack.probe(spec)`, from the cache when these modules were probed with this install (a
    module installed, removed, upgraded or reinstalled since changes the key)."""
    modules = required(spec)

    def dump(probes: list[Probe]) -> list[dict[str, Any]]:
        return [{"version": p.version, "error": p.error, "where": p.where} for p in probes]

    def load(payload: list[dict[str, Any]]) -> list[Probe]:
        if len(payload) != len(modules):
            raise ValueError("the entry lists other modules")
        return [Probe(m, p["version"], p["error"], p["where"]) for m, p in zip(modules, payload, strict=True)]

    return _cached(
        "the stack check",
        "stack",
        stack_inputs(spec),
        lambda: probe(spec),
        (dump, load),
        f"importing the Megatron stack to check the {len(modules)} modules this run imports",
    )


def effective_inputs(spec: RunSpec) -> dict[str, Any]:
    """Everything the effective configuration and the family table depend on."""
    return {
        "spec": _spec_key(spec),
        **_python(),
        "environment": keying().environment,
        "code": code_version(*EFFECTIVE_ROOTS),
    }


def planned_effective(spec: RunSpec) -> tuple[Planned, Entry]:
    """`effective.plan_effective(spec)`, from the cache when this configuration was built with
    this install, this environment and this code. A build that raises is not kept."""
    recipes = family_recipes(spec)
    gpus = ", ".join(r.gpu for r in recipes)
    return _cached(
        "the effective configuration and the family table",
        "effective",
        effective_inputs(spec),
        lambda: plan_effective(spec),
        (Planned.to_json, Planned.from_json),
        f"building Bridge's ConfigContainer for model={spec.model.name} on the {len(recipes)} perf recipe(s) "
        f"of its family ({gpus}) and running Bridge's runtime update on each",
    )


def library_inputs(spec: RunSpec) -> dict[str, Any]:
    """Everything the library checks' findings depend on: the effective configuration's inputs and
    the checks' own code."""
    return {**effective_inputs(spec), "code": code_version(*LIBRARY_ROOTS)}


def _dump_library(found: list[LibraryFinding]) -> list[dict[str, str]]:
    return [{"check": f.check.value, "message": f.message, "where": f.where} for f in found]


def _load_library(payload: list[dict[str, str]]) -> list[LibraryFinding]:
    return [LibraryFinding(Check(f["check"]), f["message"], f["where"]) for f in payload]


LIBRARY_CHECKS = "the library checks"


def stored_library_checks(spec: RunSpec) -> tuple[list[LibraryFinding], Entry] | None:
    """The library checks' findings for this point when the cache holds them; None otherwise
    (nothing is imported or built: a sweep asks this before handing a point to its worker)."""
    return _lookup(LIBRARY_CHECKS, _slot("library", library_inputs(spec)), _load_library)


def library_checks(spec: RunSpec) -> tuple[list[LibraryFinding], Entry]:
    """`library_checks.check_point(spec)`, from the cache when this configuration was judged with
    this install, this environment and this code."""
    return _cached(
        LIBRARY_CHECKS,
        "library",
        library_inputs(spec),
        lambda: check_point(spec),
        (_dump_library, _load_library),
        "running the library's own checks (Bridge's runtime update, the ViT config, TE, Megatron-LM's "
        "validate_args) on this point",
        # "The checks did not run here" is not a verdict on the point: the next plan tries again.
        keep=lambda found: all(f.refuses for f in found),
    )
