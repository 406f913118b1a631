#!/usr/bin/env bash
# GPU verification run for the device machine (torch 2.11 + triton 3.6 there).  Writes logs under $OUT.
#   bash tools/gpu/session.sh                  everything below (needs .whl/ with the zstandard, redis, cryptography,
#                                              cffi and pycparser wheels)
#   TESTS=1 VLLM=0 COVERAGE=0 BENCH=0 MAIN_JOB=0 TTFO=0 ...  pick parts: the GPU tests, the vLLM adaptor round
#                                              trip, tools/bench/coverage.py (CASES=a,b for a subset, PROFILE=1), the
#                                              Llama load benchmark, the main job, time to first output
#                                              (MODELS="llama qwen2 resnet18", PROFILE_MODEL=llama; OPTS=Inductor
#                                              options JSON with TAG=name; PROBE=1 adds tools/profile/ttfo_probe.py)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 XDG_CACHE_HOME=/tmp/xdg
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "${TESTS:-1}" = 1 ]; then
  python3 -m pytest -q -p no:cacheprovider tests/inductor/test_gpu_paths.py tests/inductor/test_gpu_picks.py tests/inductor/test_gpu_wrapper_graph.py \
    tests/inductor/test_gpu_no_host_code.py \
    tests/loader/test_fast_load.py -k gpu \
    2>&1 | tee "$OUT/gpu_tests.log" | grep -v "^DEBUG\|^INFO" | tail -40
fi
if [ "${VLLM:-0}" = 1 ]; then  # the vLLM adaptor's round trip on vLLM-shaped bf16 pieces (no vLLM there)
  python3 tools/gpu/vllm_adaptor.py --device cuda 2>&1 | grep -v "^DEBUG" | tee "$OUT/vllm_adaptor.log" | tail -40
fi
if [ "${COVERAGE:-1}" = 1 ]; then
  COLUMNS=160 python3 tools/bench/coverage.py --device cuda ${CASES:+--cases "$CASES"} ${PROFILE:+--profile} \
    --json-out "$OUT/coverage_cuda.json" \
    2> "$OUT/coverage_cuda.err" | tee "$OUT/coverage_cuda.txt"
  tail -5 "$OUT/coverage_cuda.err"
fi
CFG='{"num_hidden_layers":8,"hidden_size":1024,"intermediate_size":2816,"num_attention_heads":16,"num_key_value_heads":8,"vocab_size":32000}'
if [ "${MAIN_JOB:-0}" = 1 ]; then
  PRECOMPILE_LOG=INFO python3 tools/main_job.py --recipes llama --device cuda --dtype bfloat16 --shapes 4x256 \
    --config "$CFG" --jobs 1 --json "$OUT/main_job.json" 2>&1 | grep -v "Loading weights" | tee "$OUT/main_job.log"
fi
# load benchmark (Llama 8 layers, hidden 1024, bf16, 4x256)
if [ "${BENCH:-0}" = 1 ]; then
  COLUMNS=120 python3 tools/bench/load.py --model llama --config "$CFG" --device cuda --dtype bfloat16 --shape 4x256 \
    --calls 50 --concurrent 8 --json-out "$OUT/bench_llama.json" 2> "$OUT/bench_llama.err" | tee "$OUT/bench_llama.txt"
fi
# time to first output (load + first call) for the models, and a profile of the Llama's first call with
# and without priming
QCFG='{"num_hidden_layers":6,"hidden_size":1024,"intermediate_size":2816,"num_attention_heads":16,"num_key_value_heads":8,"vocab_size":32000}'
if [ "${TTFO:-0}" = 1 ]; then
  for m in ${MODELS:-llama qwen2 resnet18}; do
    case $m in
      llama) args=(--model llama --config "$CFG" --shape 4x256) ;;
      qwen2) args=(--model qwen2 --config "$QCFG" --shape 2x256) ;;
      resnet18) args=(--model tools.cases.recipes:resnet18 --shape 16x224) ;;
    esac
    tag=$m${TAG:+-$TAG}
    COLUMNS=120 timeout ${BENCH_TIMEOUT:-300} python3 tools/bench/load.py "${args[@]}" --device cuda --dtype bfloat16 \
      --calls 20 --repeat 1 ${OPTS:+--options "$OPTS"} --workdir "/tmp/ttfo-$tag" --json-out "$OUT/ttfo_$tag.json" \
      2> "$OUT/ttfo_$tag.err" | tee "$OUT/ttfo_$tag.txt"
    tail -3 "$OUT/ttfo_$tag.err"
    if [ "${PROBE:-0}" = 1 ] && [ -f "$OUT/ttfo_$tag.json" ]; then  # where the time to first output goes
      key=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['key'])" "$OUT/ttfo_$tag.json")
      timeout 240 python3 tools/profile/ttfo_probe.py "$key" --cache "file:///tmp/ttfo-$tag/cache" \
        --inputs "/tmp/ttfo-$tag/inputs.pt" --rounds ${PROBE_ROUNDS:-3} 2>&1 | grep -v "^DEBUG" | tee "$OUT/probe_$tag.txt"
    fi
    if [ "$m" = "${PROFILE_MODEL:-llama}" ] && [ -f "$OUT/ttfo_$m.json" ]; then
      key=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['key'])" "$OUT/ttfo_$m.json")
      for prime in off on; do
        echo "--- first call of $m, PRECOMPILE_PRIME=$prime"
        PRECOMPILE_PRIME=$prime python3 tools/profile/first_call.py "$key" --cache "file:///tmp/ttfo-$m/cache" \
          --inputs "/tmp/ttfo-$m/inputs.pt" --top 14 2>&1 | grep -v "^DEBUG" | tee -a "$OUT/first_call_profile.txt"
      done
    fi
  done
fi
ls -la "$OUT"
