"""`moe-vlm report | status | advise`: one console script, one module per subcommand."""

from __future__ import annotations

import importlib
import sys

from moe_vlm.base.errors import EXIT_INVALID

SUBCOMMANDS = {
    "report": ("moe_vlm.cli.report", "turn run and sweep directories into ranked tables and plots"),
    "status": (
        "moe_vlm.launch.status",
        "per-point state of a sweep (queued/running/completed/failed/rejected)",
    ),
    "advise": ("moe_vlm.cli.advise", "what to run first, or what to try next after a sweep"),
    "calibrate": ("moe_vlm.cli.calibrate", "fit the step-time prediction on recorded runs"),
    "recipes": (
        "moe_vlm.knobs.recipes",
        "the Bridge perf recipes recipe=<name> reproduces (layout, GPUs, published figure)",
    ),
}


def usage() -> str:
    lines = ["usage: moe-vlm {" + "|".join(SUBCOMMANDS) + "} [args...]", ""]
    lines += [f"  {name:<8} {summary}" for name, (_, summary) in SUBCOMMANDS.items()]
    lines += ["", "`moe-vlm COMMAND --help` shows a command's arguments; e.g. moe-vlm advise --help"]
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
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
