"""One run: the Hydra task function, the dry-run plan and plan.json."""
