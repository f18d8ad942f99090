"""`python -m moe_vlm.cli.main`: the `moe-vlm` console script."""

import sys

from moe_vlm.cli.main.main import main

sys.exit(main())
