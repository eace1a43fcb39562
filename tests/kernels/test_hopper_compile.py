"""The gated GEMVs, four int8 GEMVs (one reading W by TMA, one GPTQ's), the split paged attention (also rotating q and
k, and taking its requests in an order) and its combine, RMSNorm (also summing an MoE layer's pairs), the sampler's
draw, the fused MoE GEMM (also with B's tiles by TMA), the decode graphs' first kernel and moe_align's kernels
compiled for an H100 (sm_90) by Triton's own compiler, on any machine: what the interpreter (the CPU tests' way of
running them) does not check, such as the shapes a compiled kernel must keep and where it waits for the kernel
before it. The compiler runs in a child process, since this folder's kernels are imported interpreted (conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

# Each variant: (kernel, its pointer and float arguments' types, its constexprs); other runtime arguments are int32.
DENSE = ("wick.kernels.dense_gemv:_dense_gemv_kernel",
         {"x_ptr": "*bf16", "w_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16", "residual_ptr": "*bf16",
          "norm_ptr": "*bf16", "residual_out_ptr": "*bf16", "normed_out_ptr": "*bf16", "eps": "fp32"})
FP8 = ("wick.kernels.fp8_matmul:_fp8_gemv_kernel",
       {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "out_ptr": "*bf16", "experts_ptr": "*i64"})
VARIANTS = {
    **{f"dense act {act} norm {norm}": (*DENSE, {"BLOCK_N": 2, "BLOCK_K": 1024, "HAS_BIAS": True, "ACT": act,
                                                 "NORM": norm, "PDL": 1})
       for act, norm in ((-1, False), (0, False), (1, False), (2, False), (-1, True), (0, True))},
    **{f"fp8 act {act} experts {experts} groups {groups}": (
        *FP8, {"BLOCK_SN": 128, "BLOCK_SK": 128 if groups > 1 else 4096, "BLOCK_N": 2,
               "BLOCK_K": 512 if groups > 1 else 2048, "GROUPS": groups, "X_ROW_DIV": 1, "EXPERTS": experts,
               "ACT": act, "PDL": int(not experts)})
       for act, experts, groups in ((-1, False, 1), (0, False, 1), (0, True, 1), (0, False, 4))},
    **{f"paged attention, split, rope {rope}, decode {decode}, {cache} cache": (
        "wick.kernels.paged_attention:_paged_attention_kernel",
        {"q_ptr": "*bf16", "k_cache_ptr": f"*{cache}", "v_cache_ptr": f"*{cache}", "out_ptr": "*bf16",
         "part_acc_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32", "part_used_ptr": "*i32",
         "query_start_loc_ptr": "*i32", "seq_lens_ptr": "*i32", "block_tables_ptr": "*i32", "order_ptr": "*i32",
         "qk_scale": "fp32",
         "v_scale": "fp32", "soft_cap": "fp32", "new_k_ptr": "*bf16", "new_v_ptr": "*bf16", "slot_mapping_ptr": "*i64",
         "cos_sin_ptr": "*fp32", "q_norm_ptr": "*bf16", "k_norm_ptr": "*bf16", "norm_eps": "fp32",
         "k_inv_scale": "fp32", "v_inv_scale": "fp32"},
        {"GROUP": 8, "GROUP_PAD": 8, "BLOCK_Q": 2, "BLOCK_M": 16, "BLOCK_N": 128, "HEAD_DIM": 128, "BLOCK_SIZE": 16,
         "REQ_CHUNK": 128, "SPLIT": True, "WINDOWED": False, "SOFT_CAP": False, "DOT_PRECISION": "tf32",
         "ROPE": rope, "QK_NORM": rope, "FP8_CACHE": cache == "fp8e4nv", "DECODE": decode, "ORDERED": rope,
         "PREFETCH": decode, "CACHE_LINE": 128 if cache == "fp8e4nv" else 64, "PDL": 2})
       for rope, cache, decode in ((False, "bf16", False), (False, "bf16", True), (True, "bf16", True),
                                   (True, "fp8e4nv", True))},
    **{f"split attention's combine, decode {decode}{', int8' if rounds else ''}": (
        "wick.kernels.split_combine:_combine_splits_kernel",
        {"out_ptr": "*bf16", "part_acc_ptr": "*fp32", "part_m_ptr": "*fp32", "part_l_ptr": "*fp32",
         "part_used_ptr": "*i32", "query_start_loc_ptr": "*i32", "q_ptr": "*i8", "d_ptr": "*fp32", "s_ptr": "*fp32"},
        {"HEAD_DIM": 128, "SPLITS_PAD": 16, "DECODE": decode, "QUANTIZE": rounds, "INTERLEAVE": rounds,
         "PDL": 2 if rounds else 1})
       for decode, rounds in ((False, False), (True, False), (True, True))},
    **{f"rms norm pdl {pdl}{', int8' if rounds else ''}{f', {top_k} pairs' if top_k else ''}": (
        "wick.kernels.rms_norm:_rms_norm_kernel",
        {"x_ptr": "*bf16", "residual_ptr": "*bf16", "residual_out_ptr": "*bf16", "weight_ptr": "*bf16",
         "out_ptr": "*bf16", "x_weight_ptr": "*bf16", "q_ptr": "*i8", "d_ptr": "*fp32", "s_ptr": "*fp32",
         "pair_weights_ptr": "*fp32", "eps": "fp32", "x_eps": "fp32"},
        {"D": 4096 if rounds else 1024, "BLOCK_D": 4096 if rounds else 1024, "BLOCK_ROWS": 1 if rounds else 2,
         "HAS_RESIDUAL": True, "X_NORM": False, "QUANTIZE": rounds, "INTERLEAVE": rounds, "TOP_K": top_k,
         "PDL": pdl})
       for pdl, rounds, top_k in ((1, False, 0), (2, False, 0), (2, True, 0), (2, True, 8))},
    "act and mul, int8": (
        "wick.kernels.activation:_act_and_mul_kernel",
        {"x_ptr": "*bf16", "out_ptr": "*bf16", "q_ptr": "*i8", "d_ptr": "*fp32", "s_ptr": "*fp32"},
        {"ACT": 0, "BLOCK": 1024, "QUANTIZE": True, "INTERLEAVE": True, "PDL": 2}),
    **{f"int8 gemv {name}": (
        f"wick.kernels.gguf_k_gemv:{kernel}",
        {"xq_ptr": "*i8", "xd_ptr": "*fp32", "xs_ptr": "*fp32", "w_ptr": "*u8", "out_ptr": "*bf16",
         "work_ptr": "*fp32", "counts_ptr": "*i32", "experts_ptr": "*i64"},
        {"BLOCK_N": 8, "BLOCK_B": 2, "SPLIT": True, "DP4A": True, "EXPERTS": False, "X_ROW_DIV": 1, "PDL": 1,
         **extra})
       for name, kernel, extra in (("q4_k", "_k_q8_gemv_kernel", {"FIFTH_BIT": False}),
                                   ("iq4_xs", "_iq4_xs_q8_gemv_kernel", {}))},
    **{f"int8 gemv by tma, q4_k{', experts' if experts else ''}": (
        "wick.kernels.gguf_k_gemv:_q4_k_q8_tma_gemv_kernel",
        {"xq_ptr": "*i8", "xd_ptr": "*fp32", "xs_ptr": "*fp32", "head_desc": "tensordesc<i32[8, 4, 4]>",
         "codes_desc": "tensordesc<i32[8, 4, 32]>", "out_ptr": "*bf16", "work_ptr": "*fp32", "counts_ptr": "*i32",
         "experts_ptr": "*i64"},
        {"BLOCK_N": 8, "BLOCK_B": 4, "SPLIT": True, "DP4A": True, "EXPERTS": experts, "X_ROW_DIV": 1, "STAGES": 3,
         "PDL": 1})
       for experts in (False, True)},
    **{f"int8 gemv gptq{', experts' if experts else ''}": (
        "wick.kernels.wna16_matmul:_w4a8_gemv_kernel",
        {"xq_ptr": "*i8", "xd_ptr": "*fp32", "xs_ptr": "*fp32", "qweight_ptr": "*i32", "scales_ptr": "*bf16",
         "zeros_ptr": "*bf16", "out_ptr": "*bf16", "work_ptr": "*fp32", "counts_ptr": "*i32", "experts_ptr": "*i64"},
        {"BLOCK_N": 32, "BLOCK_K": 128, "SPLIT": True, "DP4A": True, "X_ROW_DIV": 8 if experts else 1,
         "EXPERTS": experts, "PDL": 1})
       for experts in (False, True)},
    "decode inputs, rows ranked": (
        "wick.kernels.decode_inputs:_decode_inputs_kernel",
        {"ids_ptr": "*i64", "previous_rows_ptr": "*i64", "samples_ptr": "*i64", "table_shape_ptr": "*i32",
         "packed_ptr": "*i32", "table_ptr": "*i32", "seq_lens_ptr": "*i32", "order_ptr": "*i32"},
        {"BLOCK": 256, "ORDER": True}),
    "sampling race, bf16 logits": (
        "wick.kernels.sampling:_race_chunk_kernel",
        {"logits_ptr": "*bf16", "temperature_ptr": "*fp32", "seeds_ptr": "*i64", "steps_ptr": "*i64",
         "part_score_ptr": "*fp32", "part_token_ptr": "*i32", "greedy_below": "fp32"},
        {"BLOCK": 1024}),
    **{f"fused moe gemm, {name}": (
        "wick.kernels.fused_moe:_moe_gemm_kernel",
        {"a_ptr": "*bf16", "b_ptr": "*bf16", "b_desc": "tensordesc<bf16[128, 64]>" if tma else "*bf16",
         "c_ptr": "*bf16", "weights_ptr": "*fp32", "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32",
         "num_padded_ptr": "*i32", "s_ptr": "*fp32", "z_ptr": "*fp32"},
        {"A_ROW_DIV": 8, "GATED": gated, "MUL_WEIGHT": not gated, "DIRECT": False, "SCALING": "none", "SCALE_N": 1,
         "SCALE_K": 1, "BITS": 0, "TMA": tma, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": group,
         "TAIL_M": tail, "DOT_PRECISION": "tf32"})
       for name, gated, group, tail, tma in (("gated, tail", True, 1, 32, False), ("down, no tail", False, 0, 0, False),
                                             ("gated, tail, tma", True, 1, 32, True))},
    **{f"moe align {kernel}": (
        f"wick.kernels.moe_align:{kernel}",
        {arg: "*i32" for arg in ("ids_ptr", "counts_ptr", "rank_ptr", "offsets_ptr", "totals_ptr", "block_expert_ptr",
                                 "num_padded_ptr", "sorted_ids_ptr")},
        extra)
       for kernel, extra in (("_count_chunks_kernel", {"E": 128, "E_PAD": 128, "CHUNK": 64}),
                             ("_chunk_offsets_kernel", {"BLOCK": 1024}),
                             ("_place_pairs_kernel", {"E": 128, "E_PAD": 128, "CHUNK": 64, "BLOCK_M": 128}))},
}

CHILD = """
import importlib, json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
sys.path.insert(0, sys.argv[1])
from test_hopper_compile import VARIANTS
order, tma, prefetched, loaded = {}, {}, {}, {}
for name, (where, pointers, constexprs) in VARIANTS.items():
    module, kernel = where.split(":")
    kernel = getattr(importlib.import_module(module), kernel)
    signature = {arg: pointers.get(arg, "constexpr" if arg in constexprs else "i32") for arg in kernel.arg_names}
    ptx = triton.compile(ASTSource(kernel, signature=signature, constexprs=constexprs),
                         target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    order[name] = re.findall(r"griddepcontrol\\.(\\w+)", ptx)
    tma[name] = len(re.findall(r"cp\\.async\\.bulk\\.tensor", ptx))
    # the L2 prefetches issued before the wait, and after it
    before, _, after = ptx.partition("griddepcontrol.wait")
    prefetched[name] = [before.count("prefetch.global.L2"), after.count("prefetch.global.L2")]
    loaded[name] = len(re.findall(r"ld\\.global", before))  # the global loads issued before the wait
print(json.dumps([order, tma, prefetched, loaded]))
"""


@pytest.mark.skipif("nvidia" not in triton.backends.backends, reason="Triton without its CUDA backend")
def test_kernels_compile_for_hopper() -> None:
    """Every variant compiles; those launched with PDL wait for their predecessor (griddepcontrol.wait); a small
    kernel releases its successor before its wait where PDL is 1 and after it where 2 (as the norm that rounds its row
    for an int8 GEMV does, and the activation and the attention's combine that do), a GEMV at its start; GPTQ's int8
    GEMV loads its first weights before its wait, but over experts (whose ids the wait guards) nothing; the K-quant
    GEMV by TMA issues its blocks' loads ahead (Triton's pipeliner took them)."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    child = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent)], env=env, capture_output=True,
                           text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    order, tma, prefetched, loaded = json.loads(child.stdout.strip().splitlines()[-1])
    assert {name: "wait" in steps for name, steps in order.items()} == {
        name: bool(constexprs.get("PDL")) for name, (_, _, constexprs) in VARIANTS.items()}
    assert order["rms norm pdl 1"] == ["launch_dependents", "wait"]
    assert order["rms norm pdl 2"] == ["wait", "launch_dependents"]
    assert order["rms norm pdl 2, int8"] == order["rms norm pdl 2, int8, 8 pairs"] == order["act and mul, int8"] == [
        "wait", "launch_dependents"]
    assert order["split attention's combine, decode True, int8"] == ["wait", "launch_dependents"]
    assert order["int8 gemv gptq"] == order["int8 gemv gptq, experts"] == ["launch_dependents", "wait"]
    assert loaded["int8 gemv gptq"] > 0 and loaded["int8 gemv gptq, experts"] == 0
    assert order["dense act -1 norm False"][0] == order["dense act 0 norm True"][0] == "launch_dependents"
    # a decode step's attention asks for its first key tile's keys and values (and with rope its cos/sin) before it
    # waits, and for nothing after; a prefill's asks for nothing
    for name, counts in prefetched.items():
        if name.startswith("paged attention"):
            assert (counts[0] > 0, counts[1]) == ("decode True" in name, 0), (name, counts)
    # The blocks by TMA, STAGES - 1 steps issued ahead of the loop and one in it: 2 x 2 + 2 tiles.
    assert tma["int8 gemv by tma, q4_k"] == tma["int8 gemv by tma, q4_k, experts"] == 6
