"""What a run writes: run.json and steps.jsonl, their shape, the report's columns, the experiment logger, profiling."""
