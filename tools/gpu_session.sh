#!/usr/bin/env bash
# GPU verification run for the device machine (torch 2.11 + triton 3.6 there).  Writes logs under $OUT.
#   bash tools/gpu_session.sh            (needs .whl/ with the zstandard wheel carried along)
#   MAIN_JOB=0 bash tools/gpu_session.sh (the load benchmark only)   BENCH=0 ... (the main job only)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 XDG_CACHE_HOME=/tmp/xdg
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
CFG='{"num_hidden_layers":8,"hidden_size":1024,"intermediate_size":2816,"num_attention_heads":16,"num_key_value_heads":8,"vocab_size":32000}'
run() {  # name, extra args...
  local name=$1; shift
  PRECOMPILE_LOG=INFO python3 tools/main_job.py --recipes llama --device cuda --dtype bfloat16 --shapes 4x256 \
    --config "$CFG" --jobs 1 --json "$OUT/$name.json" "$@" 2>&1 | grep -v "Loading weights" | tee "$OUT/$name.log"
}
if [ "${MAIN_JOB:-1}" = 1 ]; then
  run default
  run autotune --options '{"max_autotune": true}'
  for k in $(python3 -m precompile.cli ls --json | python3 -c "import json,sys; print(' '.join(i['key'] for i in json.load(sys.stdin)))"); do
    COLUMNS=200 python3 -m precompile.cli inspect "$k" > "$OUT/inspect_${k:0:12}.txt" 2>&1
    python3 -m precompile.cli inspect "$k" --json > "$OUT/manifest_${k:0:12}.json" 2>&1
  done
  python3 -m precompile.cli stats
fi
# load benchmark (issue 4's anchor: Llama 8 layers, hidden 1024, bf16, 4x256), default and max_autotune
if [ "${BENCH:-1}" = 1 ]; then
  for mode in default autotune; do
    opts=(); [ $mode = autotune ] && opts=(--options '{"max_autotune": true}')
    COLUMNS=120 python3 tools/bench_load.py --model llama --config "$CFG" --device cuda --dtype bfloat16 --shape 4x256 \
      --calls 50 --concurrent 8 "${opts[@]}" --json-out "$OUT/bench_$mode.json" 2> "$OUT/bench_$mode.err" \
      | tee "$OUT/bench_$mode.txt"
    cat "$OUT/bench_$mode.json"
  done
fi
ls -la "$OUT"
