"""The commands people type: `moe-vlm report | status | advise | calibrate | recipes` and `train.py --help`."""
