"""Every rule in the catalogue fires on a config that breaks it and stays quiet on one that does not."""

from __future__ import annotations

import functools
import io
import tempfile
from pathlib import Path

import pytest

from moe_vlm.rules import CATALOGUE, validate
from tests.conftest import REPO, make_spec


@functools.cache
def long_shards() -> str:
    """A real (Energon-layout) dataset of 4 samples, one with a 3,000-byte caption: longer than
    seq_length=1024 once encoded, and shorter than 4096 (A014, A015)."""
    from PIL import Image

    from moe_vlm.data.energon import CaptionedImage, write_dataset

    def jpeg(shade: int) -> bytes:
        out = io.BytesIO()
        Image.new("RGB", (96, 64), (shade, 90, 40)).save(out, format="JPEG")
        return out.getvalue()

    captions = ["A short caption.", "x" * 3000, "Another short one.", "A fourth."]
    samples = [CaptionedImage(f"s{i:02d}", jpeg(40 * i), text) for i, text in enumerate(captions)]
    out = Path(tempfile.mkdtemp(prefix="moe_vlm_a014_")) / "shards"
    write_dataset(out, samples, samples_per_shard=2)
    return str(out)


SHARDS = "{shards}"  # replaced by long_shards() where a case names it

# A small GPU-cluster run on the Megatron engine: 1 B200 node (8 GPUs), Qwen3-VL-30B-A3B, EP auto = 8.
MEG = ["cluster=b200", "model=qwen3_vl_30b_a3b", "nodes=1"]
GB200 = ["cluster=gb200", "model=qwen3_vl_30b_a3b", "nodes=2"]
BIG_3D = ["cluster=b200", "model=qwen3_vl_235b_a22b", "nodes=8", "parallelism=3d", "pp=8"]
TE = "cuda_graph=te_moe"
# Qwen3-VL-235B on 16 GB200 nodes with FSDP, synthetic images: the memory rules' test bed.
BIG_FSDP = ["cluster=gb200", "model=qwen3_vl_235b_a22b", "nodes=16", "dispatcher=hybridep", "data=synthetic"]
# Just over GPU memory, within the estimate's 10 %: about 192 GiB of 185 (5,376 positions).
BIG_FSDP_OVER = [*BIG_FSDP, "seq_length=5376"]

# code -> (overrides that fire it, overrides that do not)
CASES: dict[str, tuple[list[str], list[str]]] = {
    "C001": (["mbs=0"], []),
    "C003": (["train_iters=2", "warmup_steps=2"], ["train_iters=3", "warmup_steps=2"]),
    "C005": (["weight_decay=-0.1"], ["weight_decay=0.1"]),
    "C004": (
        ["vision_freeze=vision_projector", "vision_freeze.language=true"],
        ["vision_freeze=vision_projector"],
    ),
    "L001": ([*MEG, "parallelism=3d", "tp=3"], [*MEG, "parallelism=3d", "tp=2"]),
    "L002": ([*MEG, "ep=16"], [*MEG, "ep=8"]),
    "L003": ([*MEG, "ep=3"], [*MEG, "ep=4"]),
    # 94 layers over PP=8 is uneven; 11 + 6 x 12 + 11 = 94 is the explicit uneven split.
    "L004": (BIG_3D, [*BIG_3D, "parallelism.first_stage_layers=11", "parallelism.last_stage_layers=11"]),
    # 32 heads, 4 query groups: TP=8 replicates the groups (allowed); TP=3 splits neither.
    "L005": ([*MEG, "parallelism=3d", "tp=3"], [*MEG, "parallelism=3d", "tp=8"]),
    "L006": ([*MEG, "gbs=100"], [*MEG, "gbs=64"]),
    "L007": (
        [*MEG, "parallelism=3d", "cp=2", "seq_length=4098"],
        [*MEG, "parallelism=3d", "cp=2", "seq_length=4096"],
    ),
    "L008": ([*MEG, "parallelism=3d", "vp=2"], [*MEG, "parallelism=3d", "pp=2", "vp=2"]),
    "L009": (
        [*MEG, "parallelism=3d", "tp=2", "ep=4"],
        [*MEG, "parallelism=3d", "tp=2", "ep=4", "parallelism.sequence_parallel=true"],
    ),
    "L015": (
        ["cluster=gb200", "model=qwen35_vl_35b_a3b", "parallelism=3d", "tp=2"],
        [
            "cluster=gb200",
            "model=qwen35_vl_35b_a3b",
            "parallelism=3d",
            "tp=2",
            "parallelism.sequence_parallel=true",
        ],
    ),
    "L010": ([*MEG, "parallelism=3d", "etp=5"], [*MEG, "parallelism=3d", "ep=4", "etp=2"]),
    "L011": ([*MEG, "nproc=16"], [*MEG, "nproc=8"]),
    "L012": ([*MEG, "parallelism.sequence_parallel=true"], MEG),
    # 94 layers over PP=8 with 2 on the first stage: fewer than the 3 deepstack levels.
    "L013": ([*BIG_3D, "parallelism.first_stage_layers=2"], [*BIG_3D, "parallelism.first_stage_layers=11"]),
    # The Qwen3.5 provider passes vp_stage; the Qwen3-VL-MoE one does not.
    "L014": (
        [*MEG, "parallelism=3d", "pp=2", "vp=2"],
        [*MEG, "parallelism=3d", "pp=2", "vp=2", "model=qwen35_vl_35b_a3b"],
    ),
    "F001": ([*MEG, "parallelism.fsdp_version=2"], MEG),
    "F002": ([*MEG, "parallelism=3d", "parallelism.sharding_strategy=optim"], [*MEG, "parallelism=3d"]),
    "F003": ([*MEG, "pp=2"], MEG),
    "F004": ([*MEG, "tp=2"], MEG),
    # Megatron FSDP hooks every TransformerLayer; 3D takes DDP's hooks off before capture.
    "F005": ([*MEG, TE], [*MEG, "parallelism=3d", TE]),
    "D001": ([*GB200, "dispatcher=deepep"], [*MEG, "dispatcher=deepep"]),
    "D002": ([*MEG, "dispatcher=hybridep", "cluster.compute_capability=12.0"], [*MEG, "dispatcher=hybridep"]),
    "D003": ([*MEG, "dispatcher=deepep", "ep=1"], [*MEG, "dispatcher=deepep"]),
    "D004": ([*MEG, "dispatcher=hybridep", "dispatcher.fp8_dispatch=true"], [*MEG, "dispatcher=hybridep"]),
    "D005": ([*MEG, "dispatcher.token_dispatcher=flex"], MEG),
    "D006": (
        [*MEG, "dispatcher.overlap_moe_expert_parallel_comm=true", "recompute=full"],
        [*MEG, "dispatcher.overlap_moe_expert_parallel_comm=true"],
    ),
    "D007": (
        [*MEG, "dispatcher=hybridep", "dispatcher.hybridep_nvlink_domain_size=72"],
        [*MEG, "dispatcher=hybridep"],
    ),
    "D008": ([*MEG, "dispatcher.overlap_moe_expert_parallel_comm=true"], MEG),
    "D009": ([*MEG, "router=forced_balance"], MEG),
    "G001": ([*MEG, TE, "cuda_graph.scope=[moe_router,bogus]"], [*MEG, TE]),
    "G002": ([*MEG, TE, "cuda_graph.impl=local"], [*MEG, "cuda_graph=full_iteration"]),
    "G003": ([*MEG, TE, "cuda_graph.scope=[moe,moe_router]"], [*MEG, TE]),
    "G004": ([*MEG, TE, "cuda_graph.scope=[moe_preprocess]"], [*MEG, TE]),
    "G005": ([*MEG, TE, "cuda_graph.scope=[moe]"], [*MEG, TE]),
    "G006": ([*MEG, TE, "cuda_graph.scope=[mlp]"], [*MEG, TE]),
    "G007": ([*MEG, TE, "recompute=full"], [*MEG, "cuda_graph=full_iteration", "recompute=full"]),
    "G008": ([*MEG, TE, "recompute=selective", "recompute.modules=[moe]"], [*MEG, TE, "recompute=selective"]),
    "G009": ([*MEG, "cuda_graph=te_attn_moe"], [*MEG, TE]),
    "G010": ([*MEG, TE, "data.packing=in_batch", "mbs=2"], [*MEG, TE]),
    "G011": ([*MEG, "cuda_graph.scope=[attn]"], MEG),
    "G012": ([*MEG, "cuda_graph=full_iteration"], [*MEG, "parallelism=3d", TE]),
    # The whole MoE layer captured: the allgather dispatcher syncs with the host; alltoall with
    # drop-and-pad does not.
    "G013": (
        [*MEG, "parallelism=3d", TE, "cuda_graph.scope=[moe]", "router=drop_and_pad", "dispatcher=allgather"],
        [*MEG, "parallelism=3d", TE, "cuda_graph.scope=[moe]", "router=drop_and_pad", "dispatcher=alltoall"],
    ),
    "R001": ([*MEG, "recompute=selective", "recompute.modules=[bogus]"], [*MEG, "recompute=selective"]),
    "R002": ([*MEG, "recompute=selective", "recompute.modules=[]"], [*MEG, "recompute=selective"]),
    # Full recompute warns only where selective is predicted to fit (30B on 8 x B200 does; the 235B
    # on 16 GB200 nodes does not: see tests/unit/test_memory.py for the figures).
    "R003": ([*MEG, "recompute=full"], [*BIG_FSDP_OVER, "recompute=full"]),
    "E001": (["parallelism=3d"], []),
    "E002": (["tp=2"], []),
    "E003": (["dispatcher=deepep"], []),
    "E004": ([TE], []),
    "E005": (["model=qwen35_vl_35b_a3b", "engine=torch"], []),
    "E006": (["parallelism.sharding_strategy=optim"], ["parallelism.sharding_strategy=optim_grads"]),
    "E007": (["engine=megatron"], ["engine=megatron", "dry_run=true"]),
    "E008": (
        ["recompute=selective", "recompute.modules=[core_attn,moe_act]"],
        ["recompute=selective", "recompute.modules=[core_attn,layernorm,moe]"],
    ),
    "E009": (["model.num_shared_experts=1", "model.shared_expert_ffn_hidden_size=32"], []),
    "E010": (["data.num_workers=2"], [*MEG, "data.num_workers=2"]),
    "E011": (["router=forced_balance"], [*MEG, "router=forced_balance"]),
    # MXFP8 on Hopper (9.0) vs Blackwell (10.0); NVFP4 likewise; FP8 current scaling runs on Hopper.
    "P001": (
        ["cluster=h100", "model=qwen3_vl_30b_a3b", "nodes=2", "precision=fp8mx"],
        [*MEG, "precision=fp8mx"],
    ),
    "P002": ([*MEG, "precision=fp8cs"], MEG),
    "P003": (["precision=fp8cs"], [*MEG, "precision=fp8cs"]),
    "P004": ([*MEG, "precision=nvfp4"], [*MEG, "parallelism=3d", "precision=nvfp4"]),
    # TP 2 with SP on B200: the recipe's TP overlap is on unless overlap.tp_comm=false.
    "P005": (
        [*MEG, "parallelism=3d", "tp=2", "ep=4", "precision=nvfp4"],
        [*MEG, "parallelism=3d", "tp=2", "ep=4", "precision=nvfp4", "overlap.tp_comm=false"],
    ),
    # Routing and fusions (rules/routing.py); 128 experts, alltoall by default.
    "X001": ([*MEG, "router.pad_to_capacity=true"], [*MEG, "router=drop_and_pad"]),
    # 0 keeps every expert empty (a negative factor Megatron turns into dropless itself).
    "X002": ([*MEG, "router.capacity_factor=0"], [*MEG, "router.capacity_factor=1.25"]),
    "X003": (
        [*MEG, "dispatcher=deepep", "router=drop_and_pad"],
        [*MEG, "dispatcher=hybridep", "router=drop_and_pad"],
    ),
    "X004": (
        [*MEG, "parallelism=3d", TE, "router.capacity_factor=1.0"],
        [*MEG, "parallelism=3d", TE, "router=drop_and_pad"],
    ),
    "X005": ([*MEG, "router.dtype=bf16"], [*MEG, "router.dtype=fp32"]),
    "X006": ([*MEG, "fusion.cross_entropy=te"], [*MEG, "fusion=all"]),
    "X007": ([*MEG, "router=drop_and_pad"], MEG),
    "X008": (["fusion=all"], [*MEG, "fusion=all"]),
    "X009": ([*MEG, "router.dtype=fp64"], [*MEG, "router.dtype=fp64", "fusion.moe_router_fusion=false"]),
    # Overlap, HSDP, offload, GC, vision graphs (rules/overlap.py). MEG is FSDP optim_grads_params, EP 8.
    "O001": ([*MEG, "overlap=none"], [*MEG, "overlap=none", "parallelism.sharding_strategy=optim"]),
    "O002": (
        [*MEG, "parallelism=3d", "overlap.bucket_size=50000000"],
        [*MEG, "parallelism=3d", "overlap=dp", "overlap.bucket_size=50000000"],
    ),
    "O003": (
        [*MEG, "overlap.grad_reduce_in_fp32=true"],
        [*MEG, "parallelism=3d", "overlap.grad_reduce_in_fp32=true"],
    ),
    # Qwen3-VL-MoE's provider turns sequence parallelism on with TP > 1.
    "O004": (
        [*MEG, "parallelism=3d", "overlap.tp_comm=true"],
        [*MEG, "parallelism=3d", "tp=2", "overlap.tp_comm=true"],
    ),
    # EP 8 on 8 GPUs leaves expert DP 1, which 2 replicas cannot divide; EP 4 leaves 2.
    "O005": ([*MEG, "parallelism.dp_outer=2"], [*MEG, "ep=4", "parallelism.dp_outer=2"]),
    "O006": (
        [*MEG, "parallelism.dp_outer_sharding=optim"],
        [*MEG, "ep=4", "parallelism.dp_outer=2", "parallelism.dp_outer_sharding=optim"],
    ),
    # 8 GB200 GPUs sit in one NVL72 segment: 2 replicas of 4 GPUs split it for nothing. 36 nodes span 2.
    "O007": (
        [*GB200, "ep=4", "parallelism.dp_outer=2"],
        [*GB200, "nodes=36", "ep=8", "parallelism.dp_outer=0"],
    ),
    "O008": ([*MEG, "offload=activations", "recompute=selective"], [*MEG, "offload=activations"]),
    "O009": ([*MEG, "offload.optimizer_fraction=1.5"], [*MEG, "parallelism=3d", "offload=optimizer"]),
    "O010": ([*MEG, "offload=optimizer"], [*MEG, "parallelism=3d", "offload=optimizer"]),
    "O011": ([*MEG, "gc.interval=-1"], [*MEG, "gc=manual"]),
    # Synthetic data: up to 2 images x 3888 patches per sample; the encoder's default graph length is 576.
    "O012": (
        [*MEG, "parallelism=3d", "cuda_graph.vision=true"],
        [*MEG, "parallelism=3d", "cuda_graph.vision=true", "cuda_graph.vision_max_seq_length=7776"],
    ),
    "O013": (["offload=optimizer"], [*MEG, "gc=manual"]),
    "O014": (
        [*MEG, "parallelism=3d", "offload=optimizer", "precision=fp8mx"],
        [*MEG, "parallelism=3d", "offload=optimizer"],
    ),
    "O015": (
        [*MEG, "parallelism=3d", "overlap.param_gather=true", "overlap.grad_reduce=false"],
        [*MEG, "parallelism=3d", "overlap=dp"],
    ),
    "O016": (
        [*MEG, "parallelism=3d", "cuda_graph.vision=true", "cuda_graph.vision_max_seq_length=7776"],
        [*MEG, "parallelism=3d", TE],
    ),
    # Ported from the library (rules/library.py).
    "B001": (
        ["cluster=h200", "model=qwen3_vl_30b_a3b", "parallelism=3d", "tp=2", "ep=4"],
        ["cluster=b200", "model=qwen3_vl_30b_a3b", "parallelism=3d", "tp=2", "ep=4"],
    ),
    "A001": (["data=real"], ["data=real", "data.path=/tmp/shards"]),
    "A002": (["data.min_images=3", "data.max_images=1"], []),
    "A003": ([*MEG, "data.packing=in_batch"], [*MEG, "data.packing=in_batch", "mbs=2"]),
    "A004": (["data=mock"], ["data=synthetic"]),
    # A005's quiet case on a real directory is in tests/unit/test_data_real.py (it needs a built dataset).
    "A005": (["data=real", "data.path=/nonexistent/moe_vlm"], ["data=synthetic", "data.path=/nonexistent"]),
    # 1 image >= 49 tokens at min_pixels=50176 (patch 16 x merge 2: 32 px per token) + 2 markers + 1 text.
    "A006": (["data=synthetic", "seq_length=32"], ["data=synthetic", "seq_length=64"]),
    # 2 images x (980 + 2) + 1 = 1965 tokens at max_pixels=1003520.
    "A007": (["data=synthetic", "seq_length=1024"], ["data=synthetic", "seq_length=2048"]),
    "A008": ([*MEG, "data.packing=in_batch", "mbs=2"], ["data.packing=in_batch", "mbs=2"]),
    "A010": (
        [*MEG, "data.packing=in_batch", "mbs=2", "dispatcher=allgather"],
        [*MEG, "data.packing=in_batch", "mbs=2", "dispatcher=alltoall"],
    ),
    # SP is on with TP 2 (the Qwen3-VL provider forces it): each sample padded to a multiple of 2.
    "A011": (
        [*MEG, "parallelism=3d", "tp=2", "data.packing=in_batch", "mbs=2"],
        [*MEG, "parallelism=3d", "data.packing=in_batch", "mbs=2"],
    ),
    # A packed row of any length (no CP/SP multiple here) into FP8 GEMMs that need multiples of 8.
    "A012": (
        [*MEG, "data.packing=in_batch", "mbs=2", "precision=fp8cs"],
        [*MEG, "data.packing=in_batch", "mbs=2", "precision=bf16"],
    ),
    # TP 2 with SP on B200: the recipe's TP overlap is on unless overlap.tp_comm=false.
    "A013": (
        [*MEG, "parallelism=3d", "tp=2", "ep=4", "data.packing=in_batch", "mbs=2"],
        [*MEG, "parallelism=3d", "tp=2", "ep=4", "data.packing=in_batch", "mbs=2", "overlap.tp_comm=false"],
    ),
    "A009": ([*MEG, "data.num_workers=0"], [*MEG, "data.num_workers=2"]),
    "A020": (
        ["data.packing=buffer", "data.packing_buffer=0"],
        ["data.packing=buffer", "data.packing_buffer=1"],
    ),
    # Real data packs by buffer on Megatron through Energon, one buffer per loader worker.
    "A021": (
        [*MEG, "data=real", f"data.path={SHARDS}", "data.packing=buffer", "data.num_workers=2"],
        [*MEG, "data=real", f"data.path={SHARDS}", "data.packing=buffer", "data.num_workers=1"],
    ),
    # One sample of 4 is over 1024 tokens: text cut (warning); packed on Megatron, Bridge raises (error).
    "A014": (
        ["data=real", f"data.path={SHARDS}", "seq_length=1024"],
        ["data=real", f"data.path={SHARDS}", "seq_length=4096"],
    ),
    "A015": (
        [*MEG, "data=real", f"data.path={SHARDS}", "seq_length=1024", "data.packing=in_batch", "mbs=2"],
        [*MEG, "data=real", f"data.path={SHARDS}", "seq_length=1024", "mbs=2"],
    ),
    "W001": ([*MEG, "parallelism=3d", "ep=4", "etp=2"], [*MEG, "parallelism=3d", "ep=8"]),
    "W002": ([*MEG, "nodes=2", "ep=16"], [*MEG, "nodes=2"]),
    "W003": ([*GB200, "dispatcher=alltoall"], GB200),
    # No recompute: MBS 2 is far over 185 GiB (an error); MBS 1 is ~7% over, inside the estimate's
    # 10% uncertainty (M003 warning); full recompute fits.
    "M001": ([*BIG_FSDP, "mbs=2"], BIG_FSDP),
    "M003": (BIG_FSDP_OVER, [*BIG_FSDP_OVER, "recompute=full"]),
    "M002": (
        # 171.6 GiB of 185 (7 % headroom) at 5,376 positions; full recompute leaves 54 %.
        [
            *BIG_FSDP,
            "recompute=selective",
            "recompute.modules=[core_attn,moe_act,layernorm]",
            "seq_length=5376",
        ],
        [*BIG_FSDP, "recompute=full", "seq_length=5376"],
    ),
    # Profiling and logging. Defaults: warmup_steps=2, train_iters=8, 2 ranks on cluster=local.
    "T001": (["profiling=torch", "profiling.steps=[2,4]"], ["profiling=torch", "profiling.steps=[3,5]"]),
    "T002": (["profiling=torch", "profiling.ranks=[2]"], ["profiling=torch", "profiling.ranks=[1]"]),
    "T003": (["profiling=memory"], [*MEG, "profiling=memory"]),
    "T004": (
        [*MEG, "profiling=torch", "profiling.steps=[8]"],
        [*MEG, "profiling=torch", "profiling.steps=[7]"],
    ),
    "T005": (["profiling=torch", "train_iters=3"], ["profiling=torch", "train_iters=4"]),
    # wandb is not in the venv (T006's own test checks the import it relies on); mlflow-skinny is (dev extra).
    "T006": (["logger=wandb"], ["logger=tensorboard"]),
    # A store under a regular file can never be created; one under a writable directory can.
    "T007": (
        ["logger=mlflow", f"logger.tracking_uri=file://{REPO}/pyproject.toml/mlruns"],
        ["logger=mlflow", "logger.tracking_uri=file:///tmp/moe_vlm_t007/mlruns"],
    ),
    # Asked of the installed MLflow's registry: no tracking store for s3 (an artifact store only).
    "T008": (
        ["logger=mlflow", "logger.tracking_uri=s3://bucket/mlruns"],
        ["logger=mlflow", "logger.tracking_uri=http://mlflow:5000"],
    ),
    # MLflow 3 refuses a file store without MLFLOW_ALLOW_FILE_STORE=true (tests/unit/test_tracker_checks.py
    # sets and clears it).
    "T009": (
        ["logger=mlflow", "logger.tracking_uri=file:///tmp/moe_vlm_t009/mlruns"],
        ["logger=mlflow", "logger.tracking_uri=http://mlflow:5000"],
    ),
}


def codes(*overrides: str) -> set[str]:
    overrides = tuple(o.replace(SHARDS, long_shards()) if SHARDS in o else o for o in overrides)
    return {finding.code for finding in validate(make_spec(*overrides))}


def test_every_rule_has_a_case() -> None:
    missing = sorted(rule.code for rule in CATALOGUE if rule.code not in CASES)
    assert not missing, f"rules without a firing/non-firing case: {missing}"


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_fires(code: str) -> None:
    fires, _ = CASES[code]
    assert code in codes(*fires), f"{code} did not fire for {fires}"


@pytest.mark.parametrize("code", sorted(CASES))
def test_rule_quiet(code: str) -> None:
    _, quiet = CASES[code]
    assert code not in codes(*quiet), f"{code} fired for {quiet}"


# Buffer packing hands Megatron one [1, MBS x row] THD row with variable_seq_lengths on
# (knobs/bridge_fields.py), so the rules that refuse variable lengths judge it as in-batch packing.
BUFFER = [*MEG, "engine=megatron", "data.packing=buffer"]
BUFFER_CASES = {
    "A008": ([*BUFFER], ["data.packing=buffer"]),
    "A010": ([*BUFFER, "dispatcher=allgather"], [*BUFFER, "dispatcher=alltoall"]),
    "G010": ([*BUFFER, TE], [*MEG, TE]),
    "A011": ([*BUFFER, "parallelism=3d", "tp=2"], [*BUFFER, "parallelism=3d"]),
    # FP8 at TP 2 under SP rounds a 4,104-position row up to 4,112 (8 x TP per rank), past the
    # userbuffers' seq_length x MBS; at 4,096 the row is seq_length long and fills them exactly.
    "A013": (
        [*BUFFER, "parallelism=3d", "tp=2", "ep=4", "precision=fp8cs", "seq_length=4104"],
        [*BUFFER, "parallelism=3d", "tp=2", "ep=4", "precision=fp8cs"],
    ),
}


@pytest.mark.parametrize("code", sorted(BUFFER_CASES))
def test_buffer_packing_is_judged_by_the_variable_length_rules(code: str) -> None:
    fires, quiet = BUFFER_CASES[code]
    assert code in codes(*fires), f"{code} did not fire for {fires}"
    assert code not in codes(*quiet), f"{code} fired for {quiet}"


def test_packing_pads_to_cp_times_tp_under_sequence_parallelism() -> None:
    """Bridge's SP multiple is CP x TP (training/config.py:1219; tests/megatron/test_packing.py runs it):
    CP 2 x TP 4 pads each packed sample to 8, not lcm(2 x CP, TP) = 4."""
    spec = make_spec(*MEG, "parallelism=3d", "cp=2", "tp=4", "ep=2", "data.packing=in_batch", "mbs=2")
    assert spec.collate_padding_multiple == 8
    (a011,) = [f for f in validate(spec) if f.code == "A011"]
    assert "a multiple of 8 " in a011.message


@pytest.mark.parametrize("fmt", ["fp8cs", "fp8mx", "nvfp4"])
def test_packing_with_a_quantized_format_is_refused_at_every_cp_sp_layout(fmt: str) -> None:
    """Bridge's packed row per rank is a multiple of 1 or 2 tokens at most (lcm(2 x CP, CP x TP) over
    CP x TP), never of the 8/16/32 TE needs; each format alone, and BF16 packing, stay quiet."""
    packed = [*MEG, "data.packing=in_batch", "mbs=2", "overlap.tp_comm=false", f"precision={fmt}"]
    for layout in (
        [],
        ["parallelism=3d", "cp=2"],
        ["parallelism=3d", "tp=2", "ep=4"],
        ["parallelism=3d", "cp=2", "tp=4", "ep=2"],
    ):
        assert "A012" in codes(*packed, *layout), layout
    assert "A012" not in codes(*MEG, f"precision={fmt}")


def test_l004_divides_a_set_first_or_last_stage_over_its_vp_chunks() -> None:
    """Qwen3.5-35B's 40 layers, PP 4 x VP 2: 3 + 2 x 16 + 5 leaves the middle even but the first stage's
    3 layers cannot split into 2 chunks (Megatron Core asserts it: tests/megatron/test_recipes.py)."""
    base = [*MEG, "model=qwen35_vl_35b_a3b", "parallelism=3d", "pp=4", "vp=2", "ep=2"]
    assert "L004" in codes(*base, "parallelism.first_stage_layers=3", "parallelism.last_stage_layers=5")
    assert "L004" not in codes(*base, "parallelism.first_stage_layers=4", "parallelism.last_stage_layers=4")


def test_a_recipe_changed_without_raising_the_predicted_peak_is_not_refused() -> None:
    """Qwen3.5 at MBS 8 on GB300 (Bridge's recipe, which the vendor ran): our estimate says 352 GiB of 268.
    A change that leaves the prediction where it was (fewer steps, real routing) is the measured run's
    size: M003 warns; one that raises it (synthetic images: the ViT's activations) is still refused."""
    recipe = "recipe=qwen35_vl_35b_a3b_pretrain_8gpu_gb300_bf16"
    for change in ("train_iters=20", "router=real"):
        found = {f.code: f for f in validate(make_spec(recipe, change))}
        assert "M001" not in found and not found["M003"].is_error, change
        assert "qwen35_vl_35b_a3b_pretrain_8gpu_gb300_bf16 (our estimate for it" in found["M003"].message
    assert "M001" in codes(recipe, "data=synthetic")


def test_the_recipe_as_written_is_a_typed_value_the_rule_reads() -> None:
    """The recipe-as-written estimate M001/M003 compare with comes from knobs/recipes.py (issue 32
    review): the same number as estimating the recipe's own option, and the rule composes no config."""
    import ast

    from moe_vlm.knobs.recipes import RecipeMemory, recipe_memory
    from moe_vlm.perf.memory import estimate
    from moe_vlm.rules import memory as memory_rules

    recipe = "recipe=qwen35_vl_35b_a3b_pretrain_8gpu_gb300_bf16"
    found = recipe_memory(make_spec(recipe, "train_iters=20"))
    written = estimate(make_spec(recipe))
    assert found == RecipeMemory(recipe.split("=")[1], written.total_gib, 268.2)
    assert recipe_memory(make_spec("model=qwen35_vl_35b_a3b")) is None
    tree = ast.parse(Path(memory_rules.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "moe_vlm.config.compose" not in imported


def test_fp8_dispatch_is_never_silently_dropped() -> None:
    # DeepEP accepts FP8 dispatch upstream, but no field of the installed engine carries the knob.
    assert "D004" in codes(*MEG, "dispatcher=deepep", "dispatcher.fp8_dispatch=true")


def test_all_findings_reported_at_once() -> None:
    findings = validate(make_spec("mbs=0", "parallelism=3d", "tp=2", "dispatcher=deepep"))
    assert {"C001", "E001", "E002", "E003"} <= {f.code for f in findings}
    levels = [f.level.value for f in findings]
    assert levels == sorted(levels), "errors come before warnings"


def test_every_finding_names_keys_and_a_fix() -> None:
    findings = validate(
        make_spec("mbs=0", "parallelism=3d", "tp=2", "dispatcher=deepep", "cuda_graph=te_moe")
    )
    for finding in findings:
        assert finding.keys and finding.message and finding.fix
        assert "\n" not in finding.line()


def test_rule_codes_are_unique_and_stable_format() -> None:
    codes_seen = [rule.code for rule in CATALOGUE]
    assert len(codes_seen) == len(set(codes_seen))
    assert all(len(code) == 4 and code[0].isalpha() and code[1:].isdigit() for code in codes_seen)


def test_readme_lists_every_rule() -> None:
    readme = (REPO / "docs" / "rules.md").read_text()
    missing = [rule.code for rule in CATALOGUE if f"| {rule.code} |" not in readme]
    assert not missing, f"docs/rules.md lacks {missing}"


# Issue 19: each of these planned VALID with `cluster=gb200 model=qwen3_vl_30b_a3b dry_run=true` and
# would crash, be refused by the library, or train something else (tests/megatron/
# test_runtime_refusals.py runs the library code behind each rule on CPU).
ISSUE_19_BASE = ("cluster=gb200", "model=qwen3_vl_30b_a3b", "dry_run=true")
ISSUE_19 = [
    ("nodes=2 precision=nvfp4", "P004"),
    ("nodes=2 parallelism=3d tp=2 ep=4 precision=nvfp4 overlap.tp_comm=true", "P005"),
    ("nodes=2 router.dtype=fp64", "X009"),
    ("nodes=2 offload=optimizer", "O010"),
    ("nodes=2 parallelism=3d ep=8 cuda_graph.vision=true cuda_graph.vision_max_seq_length=8192", "O016"),
    ("nodes=4 parallelism=3d ep=8 pp=2 cuda_graph.vision=true cuda_graph.vision_max_seq_length=8192", "O016"),
    (
        "nodes=2 parallelism=3d ep=8 cuda_graph=te_moe cuda_graph.scope=[moe] router=drop_and_pad "
        "dispatcher=allgather",
        "G013",
    ),
    ("nodes=2 parallelism=3d ep=8 overlap.param_gather=true overlap.grad_reduce=false", "O015"),
]


@pytest.mark.parametrize(("command", "code"), ISSUE_19, ids=[c for c, _ in ISSUE_19])
def test_issue_19_commands_plan_invalid(command: str, code: str) -> None:
    errors = {f.code for f in validate(make_spec(*ISSUE_19_BASE, *command.split())) if f.is_error}
    assert errors == {code}, f"{command}: {sorted(errors)}"
