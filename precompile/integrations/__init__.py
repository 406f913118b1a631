"""Integrations of precompile with serving engines and compiler front ends.

| module | what |
|---|---|
| :mod:`precompile.integrations.vllm` | vLLM: ``PrecompileAdaptor`` (its compiler interface: piecewise graphs x compile ranges), its platform and general plugins, its AOT artifact and model facts kept in the cache |
| :mod:`precompile.integrations.dynamo` | ``"precompile"`` as a named ``torch.compile`` backend (``torch_dynamo_backends`` entry point) |

None of them imports vLLM at import time: each works (and is tested) where vLLM is not installed.

May import: precompile's packages below the command line (:mod:`precompile.function`, :mod:`precompile.builder`,
:mod:`precompile.store` and what they stand on), never :mod:`precompile.cli` or the public API module
(docs/architecture.md).
"""
