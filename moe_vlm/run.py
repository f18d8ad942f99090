"""One run: compose -> spec -> validate -> (plan | engine) -> record."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from moe_vlm.errors import EXIT_FAILED, EXIT_INVALID
from moe_vlm.launch.failures import record_exception
from moe_vlm.launch.requeue import global_rank
from moe_vlm.launch.safety import scrub, scrub_files
from moe_vlm.plan import render
from moe_vlm.record import RUN_JSON, base_record, write_json_atomic
from moe_vlm.rules import errors, validate
from moe_vlm.spec import RunSpec


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(plain, dict)
    return {str(k): v for k, v in plain.items()}


def run(cfg: DictConfig) -> None:
    spec = RunSpec.from_config(cfg)
    findings = validate(spec)
    bad = errors(findings)
    if spec.dry_run:
        print(render(spec, findings))
        if bad:
            sys.exit(EXIT_INVALID)
        return

    for finding in findings:
        print(finding.line(), file=sys.stderr)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    # Secrets from the environment never reach a record, even through ${oc.env:...}.
    config = scrub(resolved_config(cfg))
    if bad:
        record = base_record(spec, config, status="rejected")
        record["findings"] = [f.to_dict() for f in findings]
        write_json_atomic(run_dir / RUN_JSON, scrub(record))
        print(
            f"moe_vlm: rejected before any work: {len(bad)} error(s) above; nothing was run.", file=sys.stderr
        )
        sys.exit(EXIT_INVALID)

    from moe_vlm.data import DataError, check_data
    from moe_vlm.engines import EngineUnavailable, RunFailed, launch

    try:
        check_data(spec)  # an unreadable dataset fails here, not inside every rank
    except DataError as exc:
        record = base_record(spec, config, status="rejected")
        record["failure"] = {"class": "invalid", "message": str(exc)}
        write_json_atomic(run_dir / RUN_JSON, scrub(record))
        print(f"moe_vlm: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_INVALID)

    try:
        launch(spec, config, run_dir)
    except EngineUnavailable as exc:
        print(f"moe_vlm: error: {exc}", file=sys.stderr)
        sys.exit(EXIT_INVALID)
    except RunFailed as exc:
        print(f"moe_vlm: run failed ({exc}); see {run_dir / RUN_JSON}", file=sys.stderr)
        sys.exit(EXIT_FAILED)
    except Exception as exc:
        # Classified into run.json unless the engine already recorded something more specific.
        record_exception(spec, config, run_dir, exc)
        raise
    finally:
        # The spec in a record holds raw values (a data path from ${oc.env:...}); mask secrets there too.
        if global_rank() == 0:
            scrub_files([run_dir / RUN_JSON, *(run_dir / ".hydra").glob("*.yaml")])
