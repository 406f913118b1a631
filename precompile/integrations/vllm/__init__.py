"""precompile inside vLLM: its compiler interface, its AOT artifact and its model facts served from the cache.

Modules: :mod:`.adaptor` (``PrecompileAdaptor``, vLLM's compiler interface: piecewise graphs x compile ranges),
:mod:`.platform` (the ``vllm.platform_plugins`` entry point that makes ``compilation_config={"backend":
"precompile"}`` pick the adaptor), :mod:`.aot` (vLLM's AOT artifact of the model's forward kept in the cache)
and :mod:`.registry` (the ``vllm.general_plugins`` entry point that keeps vLLM's model-inspection facts).

None of them imports vLLM at import time.

May import: what :mod:`precompile.integrations` may import.
"""
