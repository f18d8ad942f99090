"""The catalogue's machinery: rules register here, `validate` runs them all."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum

from moe_vlm.config.schema import (
    CudaGraphImpl,
    TokenDispatcher,
)
from moe_vlm.config.spec import RunSpec


class Level(Enum):
    error = "error"
    warning = "warning"


@dataclass(frozen=True)
class Violation:
    keys: tuple[str, ...]
    message: str
    fix: str


@dataclass(frozen=True)
class Finding:
    code: str
    level: Level
    keys: tuple[str, ...]
    message: str
    fix: str
    title: str = ""  # the rule's one-line title (its catalogue entry), for the plan's closing summary
    # The point has no shape to size (a size below 1, no sample that fits): the plan stops at the
    # verdict, since the memory estimate and the micro-batch sampler assume a point that exists.
    blocking: bool = False

    @property
    def is_error(self) -> bool:
        return self.level is Level.error

    def brief(self) -> str:
        """One short line: level, code, the rule's title and the fix (line() has the whole message)."""
        what = f"rule: {self.title}" if self.title else self.message
        return f"{self.level.value.upper()} {self.code} ({what}). Fix: {self.fix}"

    def line(self) -> str:
        return (
            f"{self.level.value.upper()} {self.code} [{', '.join(self.keys)}]: {self.message} Fix: {self.fix}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "code": self.code,
            "level": self.level.value,
            "keys": list(self.keys),
            "message": self.message,
            "fix": self.fix,
        }


Check = Callable[[RunSpec], Iterator[Violation]]


@dataclass(frozen=True)
class Rule:
    code: str
    level: Level
    title: str
    check: Check
    blocking: bool = False


CATALOGUE: list[Rule] = []
_CODES: set[str] = set()  # CATALOGUE's codes: a duplicate is refused as each rule registers


def rule(code: str, level: Level, title: str, blocking: bool = False) -> Callable[[Check], Check]:
    """blocking: an error that leaves no point to plan (Finding.blocking); errors only."""
    assert not blocking or level is Level.error, f"{code}: only an error can block the plan"

    def register(check: Check) -> Check:
        assert code not in _CODES, f"duplicate rule code {code}"
        _CODES.add(code)
        CATALOGUE.append(Rule(code, level, title, check, blocking))
        return check

    return register


def validate(spec: RunSpec) -> list[Finding]:
    """Every finding at once, errors first, in catalogue order."""
    findings = [
        Finding(r.code, r.level, v.keys, v.message, v.fix, r.title, r.blocking)
        for r in CATALOGUE
        for v in r.check(spec)
    ]
    return sorted(findings, key=lambda f: f.level is not Level.error)


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.is_error]


def unplannable(findings: list[Finding]) -> str | None:
    """Why the point cannot be sized (its blocking findings), or None: what a plan says instead of
    the memory estimate, the prediction and the micro-batch."""
    codes = sorted({f.code for f in findings if f.blocking})
    return f"the point has no shape to size ({', '.join(codes)})" if codes else None


SELECTIVE_RECOMPUTE_MODULES = (
    "core_attn",
    "moe_act",
    "layernorm",
    "mla_up_proj",
    "mlp",
    "moe",
    "shared_experts",
    "gdn_norm_out",
)
CUDA_GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")


def _uses_graphs(spec: RunSpec) -> bool:
    return spec.cuda_graph.impl is not CudaGraphImpl.none


def _flex(spec: RunSpec) -> bool:
    return spec.dispatcher.token_dispatcher is TokenDispatcher.flex
