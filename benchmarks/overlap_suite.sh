#!/usr/bin/env bash
# Overlapped scheduling on one GPU, in one run of under 10 minutes: batch-1 decode of the Qwen3-0.6B and
# Llama-3.1-8B shapes and the 256-request throughput workload of the Qwen3-0.6B shape, each with and without
# overlap; where a step's time goes at batch 1 and 256 (with and without); then the serving benchmark.
# One log per step under $OUT (or ./overlap_suite_out); every step has its own time limit.
#
#     bash benchmarks/overlap_suite.sh
suite=overlap_suite
tail_lines=12
source "$(dirname "$0")/suite_steps.sh"

latency=(python -m benchmarks.latency --attention-backend triton --output-len 512)
throughput=(python -m benchmarks.throughput --attention-backend triton --model qwen3-0.6b)
breakdown=(python -m benchmarks.step_breakdown --attention-backend triton --model qwen3-0.6b --output-len 128)
for overlap in async-scheduling no-async-scheduling; do
    step "latency_qwen06b_$overlap" 40 "${latency[@]}" --model qwen3-0.6b "--$overlap"
    step "latency_llama8b_$overlap" 55 "${latency[@]}" --model llama-3.1-8b "--$overlap"
    step "throughput_qwen06b_$overlap" 65 "${throughput[@]}" "--$overlap"
    step "breakdown_bs1_$overlap" 30 "${breakdown[@]}" "--$overlap"
    step "breakdown_bs256_$overlap" 40 "${breakdown[@]}" --batch-size 256 "--$overlap"
done
step serve_qwen06b 130 python -m benchmarks.serve --model qwen3-0.6b --tokenizer build/qwen-tokenizer \
    --attention-backend triton --json "$out/serve.json" --log-dir "$out/serve_logs"
echo "=== done in $((SECONDS - start)) s"
