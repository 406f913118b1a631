#!/usr/bin/env bash
# A venv with torchvision and timm beside precompile, for tests/function/test_vision.py and the vision cases of
# tools/bench/libs.py.  They live apart from the main venv: with torchvision installed (and PIL present),
# `import transformers` imports torchvision too, and the 0.28 wheel, which links libtorch_cuda, breaks that import
# beside the CPU torch (tools/cases/vision.py says how the classifiers import it all the same).
# Usage: bash tools/install/vision.sh [VENV] (default .venv-vision)
# Then: PRECOMPILE_REQUIRE_VISION=1 VENV/bin/python -m pytest -q tests/function/test_vision.py
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-.venv-vision}
python3 -m venv "$VENV"
# torch pinned in every command that could pull it: 2.13.0 is the CPU build here; unpinned, pip pulls CUDA
"$VENV/bin/pip" install -q torch==2.13.0 torchvision==0.28.0
# timm without its dependencies (they would re-resolve torch and torchvision), then its pure-Python ones
"$VENV/bin/pip" install -q --no-deps timm
"$VENV/bin/pip" install -q torch==2.13.0 huggingface_hub pyyaml safetensors pytest -e .
"$VENV/bin/python" -c "
import sys; sys.path.insert(0, '.')
from tools.cases.vision import import_torchvision
tv = import_torchvision()
import timm
print('torchvision', tv.__version__, 'timm', timm.__version__, 'ready in $VENV')"
