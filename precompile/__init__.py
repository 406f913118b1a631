"""precompile: build once, load fast and verified — content-hashed PyTorch Inductor artifacts in a cache.

>>> import precompile                                                      # doctest: +SKIP
>>> art = precompile.standalone_compile(gm, example_inputs, cache="file:///tmp/pc")
>>> out = art(*example_inputs)
>>> art.key, art.manifest.to_dict()["parts"].keys()
>>> art.save("model.pc")
>>> again = precompile.load("model.pc")

Attributes are imported lazily so that ``import precompile`` stays cheap on the load path.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "compile": "precompile.function.compiled",
    "CompiledFunction": "precompile.function.compiled",
    "standalone_compile": "precompile.build",
    "load": "precompile.loading",
    "Artifact": "precompile.artifact",
    "Manifest": "precompile.manifest",
    "open_cache": "cache_backends.registry",
    "backend": "precompile.capture",
}
_ERRORS = (
    "PrecompileError",
    "CacheError",
    "CacheURLError",
    "CacheUnavailableError",
    "CacheReadOnlyError",
    "ConfigError",
    "ArtifactError",
    "ArtifactFormatError",
    "ArtifactNotFoundError",
    "AmbiguousKeyError",
    "UnsafePathError",
    "UntrustedArtifactError",
    "TrustConfigError",
    "EnvironmentMismatchError",
    "UnserializableGraphError",
    "InputMismatchError",
    "BuildError",
    "OptionsError",
    "RecipeError",
)
_LAZY.update({name: "precompile.errors" for name in _ERRORS})

__all__ = sorted(_LAZY)

if TYPE_CHECKING:  # pragma: no cover
    from cache_backends.registry import open_cache
    from precompile.artifact import Artifact
    from precompile.loading import load
    from precompile.build import standalone_compile
    from precompile.capture import backend
    from precompile.function.compiled import CompiledFunction, compile  # noqa: A004
    from precompile.errors import *  # noqa: F403
    from precompile.manifest import Manifest


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'precompile' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
