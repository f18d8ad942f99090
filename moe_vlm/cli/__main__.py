"""`python -m moe_vlm.cli`: the `moe-vlm` console script."""

import sys

from moe_vlm.cli.main import main

sys.exit(main())
