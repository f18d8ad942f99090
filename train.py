"""moe_vlm entry point: `python train.py [group=option ...] [key=value ...]`."""

import sys

import hydra
from omegaconf import DictConfig

import moe_vlm.config.schema  # noqa: F401  (registers the config schema)
from moe_vlm.base.errors import EXIT_INVALID, BadInput
from moe_vlm.base.inputs import check_environment
from moe_vlm.cli import train_help
from moe_vlm.config.one_run import OneRun
from moe_vlm.config.preflight import accept_null, preflight
from moe_vlm.launch.entry import command_line

CONFIG_PATH, CONFIG_NAME = "conf", "train"


def task(cfg: DictConfig) -> None:
    # Here, not at the top: a run's engines, rules and plans (numpy; torch and Megatron when the
    # run trains) are not what `--help`, a bad override or a sweep's planning needs.
    from moe_vlm.run.task import run

    run(cfg)


main = hydra.main(version_base=None, config_path=CONFIG_PATH, config_name=CONFIG_NAME)(task)


if __name__ == "__main__":
    if train_help.wants_help(sys.argv[1:]):
        print(train_help.full())
        sys.exit(0)
    try:
        # On a login node whose site file names the cluster and launcher, a bare command is
        # submitted as a one-point sweep; inside an allocation it runs here (launch/entry.py).
        check_environment()  # the paths the environment names (docs/inputs.md), before anything
        entry = command_line(accept_null(sys.argv[1:]))
        sys.argv[1:] = entry.argv
        # A plain single run is composed once, and Hydra runs that composition (config/one_run.py).
        one = OneRun.of(task, CONFIG_PATH, CONFIG_NAME, sys.argv[1:])
        preflight(sys.argv[1:], one.compose if one is not None else None)
        if entry.note:  # after pre-flight: bad input is one line, whatever the site file says
            print(entry.note, file=sys.stderr)
    except BadInput as bad:
        print(f"moe_vlm: error: {bad}", file=sys.stderr)
        sys.exit(EXIT_INVALID)
    if one is not None:
        one.run(main)
    else:
        main()
