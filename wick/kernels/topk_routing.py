"""Top-k routing in one kernel: each token's scores (softmax or sigmoid of its router logits), the top_k
experts by score plus an optional correction bias, their unbiased scores as weights, renormalised and
scaled. One program a token: the eight-odd torch kernels of wick.layers.moe.routing.select_experts took
~30 us a layer at decode, longer than the experts' GEMMs. Grouped top-k (DeepSeek) stays in torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wick.kernels.pdl import pdl_options, pdl_prologue


@triton.jit
def _topk_routing_kernel(
    logits_ptr, bias_ptr, weights_ptr, ids_ptr, num_experts, stride_l, scaling,
    TOP_K: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    SOFTMAX: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr, PDL: tl.constexpr,
):
    pdl_prologue(PDL)
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    valid = experts < num_experts
    logits = tl.load(logits_ptr + token * stride_l + experts, mask=valid, other=float("-inf")).to(tl.float32)
    if SOFTMAX:
        exp = tl.exp(logits - tl.max(logits, axis=0))
        scores = exp / tl.sum(exp, axis=0)
    else:
        scores = tl.sigmoid(logits)
    choice = scores
    if HAS_BIAS:
        choice += tl.load(bias_ptr + experts, mask=valid, other=0.0).to(tl.float32)
    choice = tl.where(valid, choice, float("-inf"))
    slots = tl.arange(0, BLOCK_K)
    chosen_ids = tl.zeros([BLOCK_K], dtype=tl.int64)
    chosen_weights = tl.zeros([BLOCK_K], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.max(choice, axis=0)
        expert = tl.min(tl.where(choice == best, experts, BLOCK_E), axis=0)
        picked = experts == expert
        chosen_ids = tl.where(slots == j, expert.to(tl.int64), chosen_ids)
        chosen_weights = tl.where(slots == j, tl.sum(tl.where(picked, scores, 0.0), axis=0), chosen_weights)
        choice = tl.where(picked, float("-inf"), choice)
    if RENORMALIZE:
        chosen_weights = chosen_weights / tl.maximum(tl.sum(chosen_weights, axis=0), 1e-20)
    out = token * TOP_K + slots
    tl.store(weights_ptr + out, chosen_weights * scaling, mask=slots < TOP_K)
    tl.store(ids_ptr + out, chosen_ids, mask=slots < TOP_K)


def topk_routing(router_logits: torch.Tensor, top_k: int, renormalize: bool, scoring: str = "softmax",
                 correction_bias: torch.Tensor | None = None, routed_scaling_factor: float = 1.0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, top_k] fp32, expert ids [T, top_k] int64), as select_experts
    without expert groups; the ids in descending order of choice, ties to the lower id."""
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"unknown expert scoring {scoring!r}; supported: softmax, sigmoid")
    router_logits = router_logits.contiguous()
    tokens, num_experts = router_logits.shape
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=router_logits.device)
    if tokens == 0:
        return weights, ids
    _topk_routing_kernel[(tokens,)](
        router_logits, correction_bias if correction_bias is not None else router_logits, weights, ids,
        num_experts, router_logits.stride(0), routed_scaling_factor,
        TOP_K=top_k, BLOCK_E=triton.next_power_of_2(num_experts), BLOCK_K=triton.next_power_of_2(top_k),
        SOFTMAX=scoring == "softmax", HAS_BIAS=correction_bias is not None, RENORMALIZE=renormalize,
        # each of the 3 * top_k reductions over a row is a barrier-free warp shuffle within one warp
        num_warps=max(1, min(4, triton.next_power_of_2(num_experts) // 512)), **pdl_options(router_logits),
    )
    return weights, ids
