"""Integrations of precompile with serving engines and compiler front ends.

| module | what |
|---|---|
| :mod:`precompile.integrations.vllm` | ``PrecompileAdaptor``: vLLM's compiler interface (piecewise graphs x compile ranges) served from a precompile cache |
| :mod:`precompile.integrations.vllm_platform` | the ``vllm.platform_plugins`` entry point that makes ``compilation_config={"backend": "precompile"}`` pick the adaptor |
| :mod:`precompile.integrations.dynamo` | ``"precompile"`` as a named ``torch.compile`` backend (``torch_dynamo_backends`` entry point) |

None of them imports vLLM at import time: each works (and is tested) where vLLM is not installed.
"""
