"""`moe-vlm`'s subcommands: name -> (module, one-line summary). Read by `moe-vlm` (main.py) and by
`train.py --help` (train_help.py), which lists them."""

from __future__ import annotations

SUBCOMMANDS = {
    "report": ("moe_vlm.cli.report", "turn run and sweep directories into ranked tables and plots"),
    "status": (
        "moe_vlm.launch.status",
        "per-point state of a sweep (queued/running/completed/failed/rejected)",
    ),
    "advise": ("moe_vlm.cli.advise", "what to run first, or what to try next after a sweep"),
    "calibrate": (
        "moe_vlm.cli.calibrate",
        "measure this machine's rates, or scale the step model to recorded runs",
    ),
    "explain": ("moe_vlm.cli.explain", "why the step model ranks one point above another, term by term"),
    "recipes": (
        "moe_vlm.knobs.recipes",
        "the Bridge perf recipes recipe=<name> reproduces (layout, GPUs, published figure)",
    ),
}
