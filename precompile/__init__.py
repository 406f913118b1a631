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

from precompile._version import __version__

_LAZY = {
    "compile": "precompile.function.compiled",
    "CompiledFunction": "precompile.function.compiled",
    "standalone_compile": "precompile.builder.standalone",
    "load": "precompile.store.loading",
    "Artifact": "precompile.loader.artifact",
    "Manifest": "precompile.manifest.manifest",
    "open_cache": "precompile.store.opening",
    "backend": "precompile.builder.capture",
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
    from precompile.store.opening import open_cache
    from precompile.manifest.manifest import Manifest
    from precompile.builder.capture import backend
    from precompile.builder.standalone import standalone_compile
    from precompile.errors import *  # noqa: F403
    from precompile.function.compiled import CompiledFunction, compile  # noqa: A004
    from precompile.loader.artifact import Artifact
    from precompile.store.loading import load


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'precompile' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
