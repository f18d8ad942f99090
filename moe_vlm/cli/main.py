"""`moe-vlm report | status | advise`: one console script, one module per subcommand."""

from __future__ import annotations

import importlib
import sys

from moe_vlm.base.errors import EXIT_INVALID, BadInput
from moe_vlm.base.inputs import check_environment, refuse
from moe_vlm.cli import train_help
from moe_vlm.cli.commands import SUBCOMMANDS


def usage() -> str:
    lines = ["usage: moe-vlm {" + "|".join(SUBCOMMANDS) + "} [args...]", ""]
    lines += [f"  {name:<8} {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    lines += ["", "`moe-vlm COMMAND --help` shows a command's arguments; e.g. moe-vlm advise --help"]
    # What `moe-vlm advise` and `calibrate --probe` take as overrides: train.py's (`train.py --help`).
    lines += ["", "== Config groups of the runs it reads and plans (GROUP=OPTION; * marks the default) =="]
    lines += [train_help.groups(), "", f"== {train_help.FIRST_KNOBS_TITLE} ==", train_help.first_knobs()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else EXIT_INVALID
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(
            f"moe-vlm: error: unknown subcommand {name!r}; allowed: {', '.join(SUBCOMMANDS)}.",
            file=sys.stderr,
        )
        return EXIT_INVALID
    try:  # a path the environment names is checked before any subcommand reads or writes
        check_environment()
    except BadInput as exc:
        return refuse(f"moe-vlm {name}", exc)
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
