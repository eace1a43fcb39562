#!/usr/bin/env bash
# Tensor parallelism on two GPUs (an nvidia-h200-x2 lease), in one run of under 9 minutes: the all-reduce's
# GPU tests, its microbenchmark (NCCL against the one-shot kernel), then batch-1 decode latency of the
# Llama-3.1-8B shape at TP=1 and TP=2 and of the Qwen2.5-32B shape at TP=2, where a step goes at TP=2, what
# the step channel costs on this host's CPU, and last TP=2 with NCCL for every all-reduce (for comparison).
# One log per step under $OUT (or ./tp_suite_out); every step has a time limit (535 s in all), so one that
# hangs costs only its own figures.
#
#     bash benchmarks/tp_suite.sh
suite=tp_suite
source "$(dirname "$0")/suite_steps.sh"

latency=(python -m benchmarks.latency --attention-backend triton --output-len 512)
step gpu_tests 150 python -m pytest -q -m gpu tests/distributed/test_symm_all_reduce_gpu.py \
    tests/executor/test_multiproc_gpu.py tests/kernels/test_all_reduce_rms_norm.py
step bench_all_reduce 40 python -m benchmarks.kernels.bench_all_reduce
step latency_llama8b_tp1 65 "${latency[@]}" --model llama-3.1-8b -tp 1
step latency_llama8b_tp2 65 "${latency[@]}" --model llama-3.1-8b -tp 2
step latency_qwen32b_tp2 90 "${latency[@]}" --model qwen2.5-32b -tp 2
step step_breakdown_tp2 50 python -m benchmarks.step_breakdown --attention-backend triton -tp 2
step step_broadcast 20 python -m benchmarks.step_broadcast --iterations 1000
step latency_llama8b_tp2_nccl 55 env WICK_SYMM_ALL_REDUCE=0 "${latency[@]}" --model llama-3.1-8b -tp 2
echo "=== done in $((SECONDS - start)) s"
