"""The ``vllm.platform_plugins`` entry point: ``compilation_config={"backend": "precompile"}`` picks the adaptor.

vLLM resolves a custom compiler only through its platform: ``make_compiler`` instantiates
``current_platform.get_compile_backend()`` for any backend other than ``"eager"``/``"inductor"``, and the built-in
platforms name ``"inductor"`` there.  On CPU, ``CpuPlatform.check_and_update_config`` also rewrites the default
``VLLM_COMPILE`` mode to ``DYNAMO_TRACE_ONCE`` with backend ``"inductor"``, dropping any other backend.  So the
plugin's platform is the built-in one vLLM detects (CPU, CUDA, ROCm, XPU...) with these changes, all only when
the backend is ``"precompile"``:

- ``get_compile_backend()`` names :class:`precompile.integrations.vllm.adaptor.PrecompileAdaptor`;
- on a GPU, vLLM's configuration takes the defaults it gives its own backend ``"inductor"`` (vLLM sets some only
  for that backend: custom ops off so that Inductor fuses the native ops, its IR ops wrapped for its Inductor
  lowering, the fusion flags that follow): ``apply_config_platform_defaults`` lets the backend stand in as
  ``"inductor"`` until ``check_and_update_config`` puts ``"precompile"`` back, so the model compiles exactly as under
  vLLM's default, with precompile's cache.  On a CPU vLLM's own default is not ``VLLM_COMPILE`` at all, and the
  configuration is left as the backend ``"precompile"`` gets it;
- after the built-in ``check_and_update_config``, the mode the user had (``VLLM_COMPILE``: piecewise graphs x
  compile ranges) and the backend ``"precompile"`` are put back; every other setting it made is kept.

With any other backend it behaves exactly like the built-in platform.  It stays inactive (vLLM detects its own
platform as usual) when ``PRECOMPILE_VLLM_PLATFORM=0``, when another out-of-tree platform plugin is installed
(vLLM allows only one), or when vLLM detects no platform.  This is the one place that adjusts vLLM's
configuration.  (The adaptor wraps one function of vLLM's compile path, its AOT artifact load: see
:mod:`precompile.integrations.vllm.aot`.)
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import logging
import os
import weakref
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("precompile")

ADAPTOR = "precompile.integrations.vllm.adaptor.PrecompileAdaptor"
BACKEND = "precompile"
PREFIX = "Precompile"
#: Platforms whose vLLM defaults for the backend "inductor" the backend "precompile" takes too.
GPU_PLATFORMS = ("CUDA", "ROCM", "XPU")
#: The VllmConfigs between the two platform hooks whose backend stands in as "inductor", by ``id`` (held weakly:
#: a config vLLM drops between the hooks leaves, and a later one at the same address is not it).
_as_inductor: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
#: Set while vLLM loads its AOT artifact for a model configured with the backend "precompile" (vLLM 0.25 builds
#: the pieces' compiler there with no vLLM config current): :func:`loading_for_precompile`.
_AOT_LOAD: contextvars.ContextVar[bool] = contextvars.ContextVar("precompile_vllm_aot_load", default=False)


@contextlib.contextmanager
def loading_for_precompile() -> Iterator[None]:
    """While vLLM loads the AOT artifact of a model whose backend is "precompile" (:mod:`.aot` wraps the load in
    this), a compiler asked for with no vLLM config current is the adaptor."""
    token = _AOT_LOAD.set(True)
    try:
        yield
    finally:
        _AOT_LOAD.reset(token)
#: vLLM modules that hold built-in platform classes (searched by class name).
_PLATFORM_MODULES = ("cpu", "cuda", "rocm", "xpu", "zen_cpu", "tpu")


def platform_plugin() -> str | None:
    """Entry point of group ``vllm.platform_plugins``: the qualname of the wrapping platform, or None (inactive).

    Never raises: vLLM treats a raising plugin as absent, and so does this function (the reason is logged).
    """
    from precompile import config
    from precompile.errors import ConfigError

    try:
        enabled = config.vllm_platform_enabled()
    except ConfigError as err:  # vLLM would swallow it (logged at debug level): say here why the plugin stays out
        log.warning("precompile's vLLM platform plugin is inactive: %s", err)
        return None
    if not enabled:
        return None
    try:
        from importlib.metadata import entry_points

        from vllm.plugins import PLATFORM_PLUGINS_GROUP
        from vllm.platforms import builtin_platform_plugins

        others = [ep.name for ep in entry_points(group=PLATFORM_PLUGINS_GROUP) if ep.value.split(":")[0] != __name__]
        if others:
            log.info("precompile's vLLM platform stays inactive: vLLM allows one platform plugin and %s is installed "
                     "(the backend 'precompile' then caches nothing for vLLM)", others)
            return None
        found = []
        for name, detect in builtin_platform_plugins.items():
            try:
                qualname = detect()
            except Exception:  # noqa: BLE001 - vLLM's own detection treats a failing probe as absent
                qualname = None
            if qualname:
                found.append(qualname)
    except Exception as err:  # noqa: BLE001 - an entry point must not break vLLM's start
        log.warning("precompile's vLLM platform plugin is inactive: %s: %s", type(err).__name__, err)
        return None
    if len(found) != 1:
        return None
    return f"{__name__}.{PREFIX}{found[0].rsplit('.', 1)[1]}"


def __getattr__(name: str) -> Any:
    """``Precompile<BuiltinPlatform>`` classes, made on first use (so importing this module imports no vLLM)."""
    if not name.startswith(PREFIX):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    base_name = name[len(PREFIX):]
    for mod in _PLATFORM_MODULES:
        try:
            module = importlib.import_module(f"vllm.platforms.{mod}")
        except Exception:  # noqa: BLE001 - a platform module that does not import here is not ours
            continue
        base = getattr(module, base_name, None)
        if isinstance(base, type):
            cls = wrap_platform(base)
            globals()[name] = cls
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}: vLLM has no platform {base_name!r}")


def wrap_platform(base: type) -> type:
    """``base`` (a vLLM ``Platform`` class) with the changes of the module docstring."""

    gpu = base._enum.name in GPU_PLATFORMS

    class PrecompilePlatform(base):  # type: ignore[misc, valid-type]
        @classmethod
        def apply_config_platform_defaults(cls, vllm_config: Any) -> None:
            super().apply_config_platform_defaults(vllm_config)
            cc = vllm_config.compilation_config
            if gpu and cc.backend == BACKEND:
                # what vLLM decides next for its own Inductor backend only (custom ops off, so that Inductor fuses
                # the native ops; its IR ops wrapped for its Inductor lowering; the fusion defaults that follow from
                # those), it decides for precompile too: precompile compiles each piece with Inductor, and the
                # model must compile as under vLLM's default.  check_and_update_config puts the backend back.
                cc.backend = "inductor"
                _as_inductor[id(vllm_config)] = vllm_config

        @classmethod
        def check_and_update_config(cls, vllm_config: Any) -> None:
            cc = vllm_config.compilation_config
            as_inductor = _as_inductor.pop(id(vllm_config), None) is vllm_config
            if as_inductor:
                cc.backend = BACKEND
                log.info("precompile: vLLM's defaults for its Inductor backend apply (custom ops %s)",
                         list(cc.custom_ops))
            wanted, mode = cc.backend == BACKEND, cc.mode
            super().check_and_update_config(vllm_config)
            if wanted and os.environ.get("VLLM_USE_MEGA_AOT_ARTIFACT") != "0":
                # vLLM's "mega" AOT artifact bundles the pieces' Inductor artifacts from vLLM's own adaptor; with
                # this adaptor it has none and does not load back.  The plain AOT artifact (Dynamo's output and the
                # graph) loads, re-splits and asks the adaptor for each piece: precompile's keys decide, and
                # precompile.integrations.vllm.aot keeps the file in precompile's cache.  Set here, the engine's
                # processes inherit it.
                log.info("precompile: VLLM_USE_MEGA_AOT_ARTIFACT=0 (precompile's cache serves the pieces)")
                os.environ["VLLM_USE_MEGA_AOT_ARTIFACT"] = "0"
            if wanted and (cc.mode != mode or cc.backend != BACKEND):
                log.info("precompile: keeping compilation mode %s with backend %r (the %s platform set %s, %r)",
                         getattr(mode, "name", mode), BACKEND, base.__name__, getattr(cc.mode, "name", cc.mode),
                         cc.backend)
                cc.mode, cc.backend = mode, BACKEND
                if cc.compile_sizes is None:
                    # set by vLLM only where CUDA graphs are configured; piecewise dispatch needs a list
                    cc.compile_sizes = []
                if not gpu:
                    _cpu_pass_config(cc.pass_config)

        @classmethod
        def get_compile_backend(cls) -> str:
            # vLLM asks this for a custom backend's compiler (make_compiler) and for the default backend of a
            # CompilationConfig whose backend is "".  With a current config, its backend decides; without one, the
            # adaptor only inside the AOT load of a model configured with "precompile" (vLLM 0.25 builds the pieces'
            # compiler there with no config set); otherwise the built-in answer ("inductor")
            from precompile.integrations.vllm import shim

            config = shim.current_config()
            backend = getattr(getattr(config, "compilation_config", None), "backend", None)
            if backend == BACKEND or (config is None and _AOT_LOAD.get()):
                return ADAPTOR
            return super().get_compile_backend()

    PrecompilePlatform.__name__ = PrecompilePlatform.__qualname__ = PREFIX + base.__name__
    PrecompilePlatform.__module__ = __name__
    return PrecompilePlatform


def _cpu_pass_config(pass_config: Any) -> None:
    """Turn off the fusion passes vLLM imports only on CUDA/ROCm/XPU (its pass manager would fail with a NameError
    on CPU): the ``fuse_*``/``enable_*`` flags of ``PassConfig``, which ``VLLM_COMPILE`` defaults on."""
    off = [name for name, value in vars(pass_config).items()
           if name.startswith(("fuse_", "enable_")) and value is True]
    for name in off:
        setattr(pass_config, name, False)
    if off:
        log.info("precompile: vLLM fusion passes off on this platform (they need a GPU): %s", ", ".join(off))

