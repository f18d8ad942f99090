"""compose_point (the planners' fast path) gives exactly what Hydra's compose gives.

A corpus of more than 500 points, each composed twice: by `moe_vlm.config.compose.compose_point`
(Hydra once per set of structural overrides, scalars applied to the cached result) and by
Hydra's public compose API (`hydra.compose`, the whole point every time). For every point:

- the resolved task config is equal (`OmegaConf.to_container(resolve=True, enum_to_str=True)`),
  and so is the typed object (`OmegaConf.to_object`: enums and numeric types included);
- the hydra.* values the planners read (the sweep directory, a preset's axes) are equal;
- the RunSpec built from it is equal, or both raise the same one-line BadInput;
- a point Hydra rejects is rejected by the fast path with the same exception type and the
  same one-line message (`explain`).

The corpus: every option of every config group, every typed leaf of the config set to values
of its type and of other types (random combinations of up to four, on six sets of group
choices), every sweep preset, interpolations in values, `+`/`++`/`~` overrides, hydra.*
overrides, and bad values. The test fails if the fast path was not taken for most points, so it
cannot pass by always falling back to Hydra.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.nodes import BooleanNode, EnumNode, FloatNode, IntegerNode, StringNode, ValueNode

from moe_vlm.base.errors import BadInput
from moe_vlm.config.compose import CONF_DIR, HYDRA_KEYS, compose_config, compose_point
from moe_vlm.config.preflight import explain
from moe_vlm.config.spec import RunSpec

GROUP_SETS = [
    [],
    ["cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2"],
    ["parallelism=3d", "recompute=selective", "cluster=b200", "model=qwen3_vl_30b_a3b"],
    ["dispatcher=hybridep", "cuda_graph=te_moe", "precision=fp8mx", "cluster=gb300"],
    ["data=mock", "vision_freeze=vision", "router=forced_balance", "fusion=all", "overlap=dp"],
    ["hydra/launcher=slurm", "hydra.launcher.partition=batch", "gc=manual", "offload=activations"],
]
SPECIAL = [
    # interpolations in values: the cached task config holds them, so points resolve through it
    ["gbs=${mbs}", "mbs=4"],
    ["seed=${nodes}", "nodes=3", "mbs=2"],
    ["data.path=/data/${oc.env:HOME}", "mbs=3", "nodes=2"],
    ["data.path=/data/${oc.env:HOME}", "data=real", "seq_length=2048"],
    ["warmup_steps=${train_iters}", "train_iters=12"],
    ["train_iters=${nodes}", "nodes=5", "lr=1"],
    ["mbs='${nodes}'", "nodes=2"],
    ["mbs=${nodes}"],
    ["gbs=${oc.env:MOE_VLM_NOT_SET_ANYWHERE,64}", "mbs=2"],
    ["gbs=${mbz}"],
    # lists, dicts, +, ++, ~
    ["recompute=selective", "recompute.modules=[core_attn,mlp]", "mbs=2"],
    ["recompute.modules=[core_attn]", "recompute.modules=[mlp]"],
    ["++mbs=3", "nodes=2"],
    ["++mbs=3", "mbs=5"],
    ["mbs=5", "++mbs=3"],
    ["+hydra.job.env_set.MOE_VLM_X=1", "mbs=2"],
    ["~router"],
    ["~router", "mbs=2"],
    ["~vision_freeze", "router=forced_balance"],
    ["+sweep=dispatcher_ab", "mbs=2"],
    ["model={name:x}"],
    ["parallelism={tp:2}", "mbs=2"],
    # hydra.* overrides: the launcher's directory, Hydra's mode, launcher settings
    ["hydra.sweep.dir=/tmp/moe_vlm_sweep", "hydra.sweep.subdir=abc", "mbs=2"],
    ["hydra.mode=MULTIRUN", "hydra.sweep.dir='/tmp/a b'", "hydra.sweep.subdir=p1", "nodes=4"],
    ["hydra/launcher=slurm_gb200", "cluster=gb200", "hydra.sweep.subdir=x", "mbs=2"],
    ["hydra.sweep.subdir=123", "mbs=2"],
    ["hydra.mode=SOMETHING"],
    ["hydra.job.chdir=true", "mbs=2"],
    # the same key twice: the last one wins
    ["mbs=2", "mbs=4"],
    ["recompute=full", "mbs=2", "recompute.num_layers=2", "recompute.num_layers=3"],
    # bad input
    ["mbs=abc"],
    ["mbs=1.5"],
    ["mbs=true"],
    ["nodes=null"],
    ["engine=gpu"],
    ["engine=megatron", "mbs=2"],
    ["parallelism.family=2d"],
    ["mbz=1"],
    ["model.hidden=3"],
    ["mbs.x=1"],
    ["recompute.modules=core_attn"],
    ["model=gpt5"],
    ["model=1"],
    ["mbs=???"],
    ["dry_run=maybe"],
    ["dry_run=full", "mbs=2"],
    ["dry_run='TRUE'", "nodes=2"],
    ["cluster=gb200", "hydra/launcher=nope"],
    ["hydra.sweep.dir=null"],
]


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def groups() -> list[str]:
    return sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra")


def typed_leaves(cfg: DictConfig, prefix: str = "") -> Iterator[tuple[str, ValueNode]]:
    for key in cfg:
        assert isinstance(key, str)  # the schema's keys are field names (OmegaConf allows bytes, int...)
        node = cfg._get_node(key)
        if isinstance(node, ValueNode):
            yield f"{prefix}{key}", node
        elif isinstance(node, DictConfig) and not node._is_none() and key != "hydra":
            yield from typed_leaves(node, f"{prefix}{key}.")


def values_for(node: ValueNode) -> list[str]:
    """Values of the node's type in every spelling Hydra parses, and values of other types."""
    if isinstance(node, EnumNode):
        members = [m.name for m in node._metadata.ref_type]
        return [*members, "bogus", "1"]
    if isinstance(node, BooleanNode):
        return ["true", "false", "'yes'", "0", "maybe"]
    if isinstance(node, IntegerNode):
        return ["3", "'7'", "0", "-2", "null", "2.5", "x"]
    if isinstance(node, FloatNode):
        return ["2", "0.25", "'1e-3'", "null", "inf", "x"]
    if isinstance(node, StringNode):
        return ["abc", "'with space'", "7", "null", "true"]
    return ["true", "full", "3", "'x y'", "null"]


def corpus() -> list[list[str]]:
    rng = random.Random(20261201)
    points: list[list[str]] = []
    for group in groups():
        for option in options(group):
            points.append([f"{group}={option}", rng.choice(["mbs=2", "nodes=2", "seed=7", "dry_run=true"])])
    leaves = list(typed_leaves(compose_config(["parallelism=3d", "recompute=full"])))
    scalars = [f"{key}={value}" for key, node in leaves for value in values_for(node)]
    rng.shuffle(scalars)
    # Every scalar override at least once, alone on the default groups...
    points += [[s] for s in scalars[:150]]
    # ...and in random combinations on other sets of group choices.
    while len(points) < 470:
        base = rng.choice(GROUP_SETS)
        chosen = rng.sample(scalars, rng.randint(1, 4))
        points.append(rng.sample([*base, *chosen], len(base) + len(chosen)))
    points += [[f"sweep={preset}", "nodes=2"] for preset in options("sweep")]
    points += SPECIAL
    return points


CORPUS = corpus()


def outcome_of_hydra(overrides: list[str]) -> tuple[str, Any]:
    """What Hydra's compose API gives: ("ok", (config, object, hydra values, spec or error))."""
    try:
        full = compose(config_name="train", overrides=overrides, return_hydra_config=True)
        task = copy.deepcopy(full)
        with open_dict(task):
            del task["hydra"]
        config = OmegaConf.to_container(task, resolve=True, enum_to_str=True)
        obj = OmegaConf.to_object(task)
    except Exception as exc:
        return "error", (type(exc), explain(exc, overrides))
    hydra: dict[str, Any] = {}
    for key in HYDRA_KEYS:
        try:  # hydra.sweep.subdir reads hydra.job.num, which only a running job has
            value = OmegaConf.select(full, key)
        except Exception as exc:
            hydra[key] = f"{type(exc).__name__}"
            continue
        hydra[key] = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
    return "ok", (config, obj, hydra, spec_or_error(lambda: RunSpec.from_config(task)))


def outcome_of_fast_path(overrides: list[str]) -> tuple[str, Any]:
    try:
        point = compose_point(overrides)
    except Exception as exc:
        return "error", (type(exc), explain(exc, overrides))
    # The values it knows without composing the whole point (hydra_value composes for the rest).
    hydra = {key: point.hydra_value(key) for key in HYDRA_KEYS if key in point.hydra}
    return "ok", (point.config, point.train, hydra, spec_or_error(lambda: point.spec))


def spec_or_error(build: Any) -> Any:
    try:
        return build()
    except BadInput as bad:
        return f"BadInput: {bad}"
    except Exception as exc:  # a layout the rules reject (a division by zero): the same in both
        return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def hydra_compose_api() -> Iterator[None]:
    compose_point([])  # the fast path's own loader first: it leaves GlobalHydra clear
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        yield
    GlobalHydra.instance().clear()


def test_the_corpus_is_big_and_covers_every_group_option() -> None:
    assert len(CORPUS) >= 500
    flat = {o for point in CORPUS for o in point}
    for group in groups():
        for option in options(group):
            assert f"{group}={option}" in flat


@pytest.mark.slow
def test_fast_path_equals_hydra_compose_on_the_corpus(
    hydra_compose_api: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MOE_VLM_NOT_SET_ANYWHERE", raising=False)
    fast = errors = 0
    for overrides in CORPUS:
        expected = outcome_of_hydra(overrides)
        found = outcome_of_fast_path(overrides)
        assert found[0] == expected[0], (overrides, found, expected)
        if expected[0] == "error":
            errors += 1
            assert found[1] == expected[1], overrides
            continue
        config, obj, hydra, spec = found[1]
        want_config, want_obj, want_hydra, want_spec = expected[1]
        assert config == want_config, overrides
        assert obj == want_obj, overrides
        assert spec == want_spec, overrides
        for key, value in hydra.items():
            assert value == want_hydra[key], (overrides, key)
        fast += compose_point(overrides).fast
    # The fast path, not Hydra, composed most points; and bad values were part of the corpus.
    assert fast >= 300, fast
    assert errors >= 60, errors


@pytest.mark.slow
def test_hydra_values_the_fast_path_does_not_know_come_from_hydra(hydra_compose_api: None) -> None:
    # hydra.sweep.dir interpolates every task override: the fast path asks Hydra for it.
    overrides = ["mbs=2", "recompute=full", "nodes=3"]
    point = compose_point(overrides)
    assert point.fast and "hydra.sweep.dir" not in point.hydra
    full = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    assert point.hydra_value("hydra.sweep.dir") == full.hydra.sweep.dir
    assert "mbs=2" in point.hydra_value("hydra.sweep.dir")
