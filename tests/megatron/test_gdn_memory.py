"""What a Gated DeltaNet layer keeps for backward, against the installed library's own save lists.

FLA's kernels (causal conv, L2 norm, chunked gated delta rule) are Triton, GPU only, so the layer cannot
run on CPU (even megatron-core's deterministic torch path calls FLA's l2norm). What each kernel's
autograd Function hands save_for_backward is read from the installed source here, and our table
(moe_vlm/perf/memory/megatron_saved.py gdn_saved) must count exactly those tensors, at their widths.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from moe_vlm.perf.memory.estimate import BF16, FP32
from moe_vlm.perf.memory.megatron_saved import gdn_saved
from tests.conftest import make_spec
from tests.megatron.conftest import needs_stack

pytestmark = needs_stack


def saved_names(function: Any) -> list[str]:
    """The argument names of the one ctx.save_for_backward(...) call in `function`'s source."""
    (args,) = re.findall(r"ctx\.save_for_backward\(([^)]*)\)", inspect.getsource(function))
    return [a.strip() for a in args.split(",")]


def test_fla_saves_inputs_and_the_wy_matrix_not_the_chunked_state() -> None:
    from fla.modules.conv.triton.ops import CausalConv1dFunction
    from fla.modules.l2norm import L2NormFunction
    from fla.ops.gated_delta_rule.chunk import ChunkGatedDeltaRuleFunction

    kernel = saved_names(ChunkGatedDeltaRuleFunction.forward)
    assert kernel[:8] == ["q", "q_rstd", "k", "k_rstd", "v", "g", "beta", "A"]
    assert "h" not in kernel  # the chunk states are recomputed in backward
    assert saved_names(L2NormFunction.forward) == ["y", "rstd"]
    assert saved_names(CausalConv1dFunction.forward)[0] == "x"


def test_megatron_feeds_the_kernel_q_and_k_at_value_head_width() -> None:
    from megatron.core.ssm.gated_delta_net.common import _GDNBase

    source = inspect.getsource(_GDNBase._prepare_input_for_gated_delta_rule)
    assert "query_key = l2norm(query_key.contiguous())" in source
    assert "query.repeat_interleave(repeat_factor, dim=2)" in source
    assert "repeat_factor = self.num_value_heads // self.num_key_heads" in source


def test_our_gdn_table_counts_those_tensors() -> None:
    model = make_spec("model=qwen35_vl_35b_a3b").model
    kd = model.linear_num_key_heads * model.linear_key_head_dim  # 2048
    vd = model.linear_num_value_heads * model.linear_value_head_dim  # 4096
    hv = model.linear_num_value_heads  # 32
    table = {e.name: e.bytes_per_token for e in gdn_saved(model)}
    assert table["GDN conv input (q, k, v channels)"] == BF16 * (2 * kd + vd)  # conv's x
    assert table["GDN q/k L2-norm output + rstd"] == BF16 * 2 * kd + FP32 * 2 * model.linear_num_key_heads
    # q and k repeated from 16 key heads to 32 value heads: 2 x 4096 wide, not 2 x 2048.
    assert table["GDN kernel q, k (value-head width), v"] == BF16 * (2 * hv * model.linear_key_head_dim + vd)
    assert table["GDN kernel A (WY, chunk 64) + g cumsum"] == BF16 * 64 * hv + FP32 * hv
    assert sum(table.values()) == 86_464  # bytes per token per GDN layer at TP 1, Qwen3.5-35B-A3B
