"""torchvision and timm classifiers compiled with ``precompile.compile`` (issue 28): a cold and a warm fresh process
per library, as in ``test_libs.py`` (warm: a hit, no frame traced, the cold process's logits bit for bit).

Needs torchvision and timm, which live in their own venv (``bash tools/install/vision.sh .venv-vision``, then
``PRECOMPILE_REQUIRE_VISION=1 .venv-vision/bin/python -m pytest -q tests/function/test_vision.py``).  Where they
are not importable every test here is skipped, unless ``PRECOMPILE_REQUIRE_VISION=1``: then they fail.
"""

from __future__ import annotations

import os

import pytest
from _libs import assert_outputs_equal, assert_warm_hits, run_group

try:
    from tools.cases.vision import import_torchvision

    import_torchvision()
    import timm  # noqa: F401

    HAVE_VISION, WHY = True, ""
except Exception as err:  # noqa: BLE001 - an install that does not import is "not there" too
    HAVE_VISION, WHY = False, f"torchvision and timm are not importable here ({type(err).__name__}: {err})"

if not HAVE_VISION and os.environ.get("PRECOMPILE_REQUIRE_VISION") == "1":
    raise RuntimeError(f"PRECOMPILE_REQUIRE_VISION=1 but {WHY}")
pytestmark = [pytest.mark.skipif(not HAVE_VISION, reason=WHY + "; see tools/install/vision.sh"), pytest.mark.slow]

GROUPS: dict[str, list[str]] = {
    "torchvision": ["tv_resnet18", "tv_vit"],
    "timm": ["timm_vit", "timm_resnet"],
}


@pytest.fixture(scope="module", params=sorted(GROUPS))
def group(request, tmp_path_factory):
    return run_group(GROUPS[request.param], tmp_path_factory.mktemp(request.param))


def test_warm_process_hits_and_traces_no_frame(group):
    assert_warm_hits(group)


def test_warm_logits_equal_the_cold_process(group):
    assert_outputs_equal(group)
