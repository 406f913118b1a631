"""Hostile wrapper graphs on a GPU: tests/manifest/test_wrapper_graph_fuzz.py's fuzz (tests/_wrapper_fuzz.py) with
``cuda`` tensors, so that the allow-list's ATen kernels (cuBLAS GEMMs, convolution, the attention kernels, copies)
run on the device.  Each input's storage is a slice of one CUDA buffer between guard regions (wrapped through
``__cuda_array_interface__``, so the storage is exactly the slice); a graph is refused by ``check``/``build``, or
runs with everything it returns inside its storage and every guard unchanged.  Kernel launches go to a stand-in
launcher (a malicious cubin is not contained: docs/format.md, "Trust").  Skipped without a CUDA GPU (CI has none).

Run on a GPU machine (and, for the device side, under compute-sanitizer)::

    PYTHONPATH=$PWD python -m pytest -q -s tests/inductor/test_gpu_wrapper_graph_fuzz.py
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import run_python

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

EXAMPLES = 1500


def test_hostile_wrapper_graphs_on_cuda_are_refused_or_run_inside_their_storages():
    out = run_python("import _wrapper_fuzz; _wrapper_fuzz.main()", "cuda", str(EXAMPLES), timeout=600)
    tally = json.loads(out.splitlines()[-1])
    print("cuda", torch.__version__, torch.cuda.get_device_name(), json.dumps(tally))
    assert sum(tally.values()) == EXAMPLES
    assert min(tally.values()) >= EXAMPLES // 50, tally


@pytest.mark.skipif(shutil.which("compute-sanitizer") is None, reason="needs compute-sanitizer")
def test_the_cuda_fuzz_makes_no_out_of_bounds_device_access():
    """The same fuzz, fewer graphs, under compute-sanitizer's memcheck: an ATen kernel reading or writing past a
    device allocation would be reported even where it hit no guard."""
    examples = 200
    out = run_python("import subprocess, sys; sys.exit(subprocess.call(['compute-sanitizer', '--error-exitcode', '9', "
                     "'--leak-check', 'no', sys.executable, '-c', 'import _wrapper_fuzz; _wrapper_fuzz.main()', "
                     "'cuda', sys.argv[1]]))", str(examples), timeout=600)
    tally = json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))
    print("cuda, compute-sanitizer", json.dumps(tally), out.splitlines()[-1])  # its "ERROR SUMMARY: 0 errors"
    assert tally["ran"] > 0
