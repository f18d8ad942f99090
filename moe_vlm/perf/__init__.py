"""What a run costs: FLOPs (ours and Bridge's), the per-GPU memory estimate, the metrics contract, stragglers."""
