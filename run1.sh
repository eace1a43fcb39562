python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site
suite=run1; source benchmarks/suite_steps.sh
tail_lines=75 step cprof1 200 python3 -m benchmarks.step_breakdown --model qwen3-0.6b --attention-backend triton --output-len 256 --cprofile-steps 200
tail_lines=45 step tprof1 150 python3 -m benchmarks.step_breakdown --model qwen3-0.6b --attention-backend triton --output-len 64 --profile-steps 64
tail_lines=70 step cprof256 200 python3 -m benchmarks.step_breakdown --model qwen3-0.6b --attention-backend triton --batch-size 256 --output-len 128 --cprofile-steps 64
