"""engine=megatron: Megatron Bridge + Megatron Core + Transformer Engine on GPU clusters.

One run, as Megatron experts would set it up by hand:

1. start from the model's Bridge perf recipe family (``knobs.bridge_recipe.select_recipe``): the GPU's
   perf recipe where one exists, another GPU's of the same generation otherwise;
2. build it offline: the recipe's ``AutoBridge.from_hf_pretrained("<hub id>")`` reads the
   config.json materialised from our `model` group (or the user's local checkpoint directory);
3. apply every row of THE mapping table (``apply_overrides``), the same rows ``dry_run=true``
   prints, and read them back (``check_overrides``);
4. run Bridge's ``pretrain`` with the Qwen3-VL forward step, one process per GPU (torchrun, or
   Slurm tasks from the launcher), recording ``steps.jsonl`` / ``run.json`` per moe_vlm.record.records.

The library is imported lazily: planning (dry_run) and the rest of the project never need it.
Running needs GPUs; everything before ``pretrain`` also works on a CPU (tests/megatron).

The package imports none of its modules: a plan reads the stack list and the plan cache
(stack.py, plan_cache.py) without loading the run's path (launch.py, recording.py).
"""
