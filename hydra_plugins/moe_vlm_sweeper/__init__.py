"""moe_vlm's Hydra plugins: the planning sweeper (default for train.py) and the submitit launchers.

Hydra discovers them through the `hydra_plugins` namespace package.
"""

from moe_vlm.cli.train_help import register_resolver as register_help
from moe_vlm.runtime.points import register_resolvers

register_resolvers()
register_help()
