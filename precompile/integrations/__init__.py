"""Integrations of precompile with serving engines and compiler front ends.

| module | what |
|---|---|
| :mod:`precompile.integrations.vllm` | ``PrecompileAdaptor``: vLLM's compiler interface (piecewise graphs x compile ranges) served from a precompile cache |
| :mod:`precompile.integrations.vllm_platform` | the ``vllm.platform_plugins`` entry point that makes ``compilation_config={"backend": "precompile"}`` pick the adaptor |
| :mod:`precompile.integrations.vllm_aot` | vLLM's AOT artifact of the model's forward kept in precompile's cache (a warm or new machine traces nothing) |
| :mod:`precompile.integrations.vllm_registry` | the ``vllm.general_plugins`` entry point that keeps vLLM's model-inspection facts as records in the cache |
| :mod:`precompile.integrations.dynamo` | ``"precompile"`` as a named ``torch.compile`` backend (``torch_dynamo_backends`` entry point) |

None of them imports vLLM at import time: each works (and is tested) where vLLM is not installed.

May import: precompile's packages below the command line (:mod:`precompile.function`, :mod:`precompile.build`,
:mod:`precompile.store` and what they stand on), never :mod:`precompile.cli` or the public API module
(docs/architecture.md).
"""
