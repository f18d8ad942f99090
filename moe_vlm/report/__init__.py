"""What a sweep's records become: the ranked table, report.md and its plots, --compare and --diff,
the --baseline gate (gate) and best.yaml (best)."""
