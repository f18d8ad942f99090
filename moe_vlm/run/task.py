"""One run: compose -> spec -> validate -> (plan | engine) -> record.

Rank 0 writes run.json with `status: running` before the engine starts and beats heartbeat.json
while it runs (moe_vlm/record/records.py), so a run killed without a word still leaves a record.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from moe_vlm.base import noise
from moe_vlm.base.errors import EXIT_FAILED, EXIT_INVALID, EngineUnavailable, RunFailed
from moe_vlm.base.files import RUN_JSON, write_atomic
from moe_vlm.base.safety import scrub, scrub_files, scrub_text
from moe_vlm.config.schema import DryRun, dry_run_mode
from moe_vlm.config.spec import RunSpec
from moe_vlm.data import DataError, check_data
from moe_vlm.engines import launch
from moe_vlm.rules import Finding, errors, validate
from moe_vlm.run.plan import PLAN_TEXT, gather, library_side, render, summary
from moe_vlm.run.plan_record import plan_of


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    plain = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(plain, dict)
    return {str(k): v for k, v in plain.items()}


def plan(spec: RunSpec, findings: list[Finding], full: bool) -> None:
    """The dry run: the plan on one screen (full: the whole plan, library output included, as
    before); plan.json and plan.txt in the run directory hold everything either way."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    with noise.captured(not full) as library_output:
        if not errors(findings):  # the library's own checks judge what the rules let through (megatron)
            findings = [*findings, *library_side(spec)]
        got = gather(spec, findings)
    whole = scrub_text(render(spec, findings, gathered=got))  # a data path may hold an ${oc.env:...} secret
    plan_of(spec, findings, got, [scrub_text(line) for line in library_output]).write(run_dir, scrub)
    write_atomic(run_dir / PLAN_TEXT, whole + "\n")
    print(whole if full else scrub_text(summary(spec, findings, got, str(run_dir), len(library_output))))
    if errors(findings):
        sys.exit(EXIT_INVALID)


def run(cfg: DictConfig) -> None:
    spec = RunSpec.from_config(cfg)
    findings = validate(spec)
    bad = errors(findings)
    if spec.dry_run:
        plan(spec, findings, full=dry_run_mode(cfg.get("dry_run")) is DryRun.full)
        return

    # The job side (records of a running job, heartbeats, failures): a dry run plans and never reaches
    # it, so it does not pay for importing it (tests/unit/test_plugin_imports.py).
    from moe_vlm.record.records import RUNNING, RunRecord
    from moe_vlm.runtime import points
    from moe_vlm.runtime.dist_env import global_rank
    from moe_vlm.runtime.failures import Diagnosis, launch_info, record_exception, write_failure
    from moe_vlm.runtime.heartbeat import Heartbeat, write_running

    if not bad:  # a refused run says its errors once, below; its warnings would wait for a run
        for finding in findings:
            print(scrub_text(finding.line()), file=sys.stderr)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    refused = points.refused(run_dir)
    if refused and not bad:  # the canary's library checks refused it on the cluster: its record says so
        first = refused[0]
        print(
            scrub_text(
                f"moe_vlm: refused before any work by {first.get('code')}: {first.get('message')}; nothing was run."
            ),
            file=sys.stderr,
        )
        sys.exit(EXIT_INVALID)
    # Secrets from the environment never reach a record, even through ${oc.env:...}.
    config = scrub(resolved_config(cfg))
    if bad:
        RunRecord.rejected(spec, config, findings).write(run_dir)
        for finding in bad:  # one line each; dry_run=true lists the warnings too
            print(scrub_text(f"moe_vlm: rejected, nothing was run: {finding.line()}"), file=sys.stderr)
        sys.exit(EXIT_INVALID)

    try:
        check_data(spec)  # an unreadable dataset fails here, not inside every rank
    except DataError as exc:
        RunRecord.rejected(spec, config, invalid=str(exc)).write(run_dir)
        print(scrub_text(f"moe_vlm: error: {exc}"), file=sys.stderr)
        sys.exit(EXIT_INVALID)

    main = global_rank() == 0
    if main:
        write_running(run_dir, RunRecord.new(spec, config, RUNNING).with_launch(launch_info()).to_json())
    try:
        with Heartbeat(run_dir) if main else contextlib.nullcontext():
            launch(spec, config, run_dir)
    except EngineUnavailable as exc:
        if main:  # the running record must not outlive the run: say why it never started
            message = str(exc)
            diagnosis = Diagnosis(
                "stack", f"the engine cannot run here: {message}", (message.splitlines() or [""])[0][:300]
            )
            write_failure(run_dir, diagnosis, [], RunRecord.failed(spec, config).to_json(), launch_info())
        print(scrub_text(f"moe_vlm: error: {exc}"), file=sys.stderr)
        sys.exit(EXIT_INVALID)
    except RunFailed as exc:
        print(f"moe_vlm: run failed ({exc}); see {run_dir / RUN_JSON}", file=sys.stderr)
        sys.exit(EXIT_FAILED)
    except (Exception, KeyboardInterrupt) as exc:
        # Classified into run.json unless the engine already recorded something more specific.
        record_exception(spec, config, run_dir, exc)
        raise
    finally:
        # The spec in a record holds raw values (a data path from ${oc.env:...}); mask secrets there too.
        if main:
            scrub_files([run_dir / RUN_JSON, *(run_dir / ".hydra").glob("*.yaml")])
