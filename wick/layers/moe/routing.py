"""Top-k routing of tokens to experts, the variants the supported families use.

- softmax scoring (Mixtral, Qwen-MoE, DeepSeek V2) or sigmoid scoring (DeepSeek V3);
- the chosen weights renormalised to sum to one, or not;
- DeepSeek's grouped top-k: experts fall in num_expert_group groups, only the topk_group best groups
  (by their best score, or by the sum of their two best with V3's correction bias) may be chosen;
- V3's correction bias steers the choice only: the weights are the unbiased scores;
- a routed scaling factor multiplies the final weights.
"""

from __future__ import annotations

import torch


def select_experts(
    router_logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    scoring: str = "softmax",
    num_expert_group: int | None = None,
    topk_group: int | None = None,
    group_score: str = "max",
    correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] -> (weights [T, top_k] fp32, expert ids [T, top_k] int64)."""
    logits = router_logits.float()
    if scoring == "softmax":
        scores = logits.softmax(dim=-1)
    elif scoring == "sigmoid":
        scores = logits.sigmoid()
    else:
        raise ValueError(f"unknown expert scoring {scoring!r}; supported: softmax, sigmoid")
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if num_expert_group is not None and num_expert_group > 1:
        choice = _mask_groups(choice, num_expert_group, topk_group or num_expert_group, group_score)
    ids = torch.topk(choice, top_k, dim=-1, sorted=True).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-20)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights, ids


def _mask_groups(choice: torch.Tensor, num_groups: int, topk_group: int, group_score: str) -> torch.Tensor:
    """Experts outside the topk_group best groups get -inf."""
    tokens, experts = choice.shape
    grouped = choice.view(tokens, num_groups, experts // num_groups)
    if group_score == "max":
        group_scores = grouped.max(dim=-1).values
    elif group_score == "top2_sum":
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    else:
        raise ValueError(f"unknown group score {group_score!r}; supported: max, top2_sum")
    best = group_scores.topk(topk_group, dim=-1, sorted=False).indices
    keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return grouped.masked_fill(~keep[..., None], float("-inf")).view(tokens, experts)
