"""What a sweep's records become: the ranked table, report.md and its plots, --compare and --diff."""
