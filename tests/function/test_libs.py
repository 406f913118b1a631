"""The library families of issue 28 compiled with ``precompile.compile`` as their users do (:mod:`tools.cases.libs`):
transformers decoder LMs (forward with a dynamic sequence length, greedy ``generate`` with a static and with the
default dynamic cache), encoders with attention masks, an encoder-decoder's ``generate``, and diffusers denoisers
with a scheduler loop.  Per group, a cold fresh process builds and a warm fresh process (empty Inductor cache,
same precompile cache) must hit, trace no frame over all its calls, and give the cold process's outputs bit for
bit; generated tokens must equal eager's.  Small configs with random weights; nothing is downloaded.

The vision families (torchvision, timm) need their own venv: ``tests/function/test_vision.py``.
"""

from __future__ import annotations

import pytest
from _libs import assert_equal_to_eager, assert_outputs_equal, assert_warm_hits, run_group

pytestmark = pytest.mark.slow  # each group compiles real models in a fresh process: 0.5-1.5 min on 2 cores

#: One cold and one warm process per group.  One generating model per group: models of one library share its
#: decorators' code, so their Dynamo entries meet on one code object (see tools/bench/libs.py for the others).
GROUPS: dict[str, list[str]] = {
    "decoder_forward": ["llama_forward", "qwen2_forward", "gpt2_forward", "mistral_forward"],
    "generate_static": ["qwen2_generate_static"],
    "generate_dynamic": ["gpt2_generate_dynamic"],
    "encoders": ["bert", "roberta", "distilbert"],
    "encoder_decoder": ["bart_generate"],
    "diffusers": ["dit", "sd3", "unet_ddim"],
}
GENERATING = {"generate_static", "generate_dynamic", "encoder_decoder"}


@pytest.fixture(scope="module", params=sorted(GROUPS))
def group(request, tmp_path_factory):
    return request.param, run_group(GROUPS[request.param], tmp_path_factory.mktemp(request.param))


def test_warm_process_hits_and_traces_no_frame(group):
    assert_warm_hits(group[1])


def test_warm_outputs_equal_the_cold_process_and_generated_tokens_equal_eager(group):
    name, run = group
    assert_outputs_equal(run)
    if name in GENERATING:
        assert_equal_to_eager(run)
