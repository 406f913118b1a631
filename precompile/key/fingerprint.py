"""The environment fingerprint: what a compiled artifact depends on besides its graph and options.

Cheap to compute (no compiler probes, no GPU kernels): it runs on every load.  Fields that decide whether a
built binary can run here are *key fields* and enter the artifact key; the rest are recorded for people
(``precompile inspect``) and never cause a miss.

Key fields: torch version and git revision, Python major.minor, machine architecture, ATen's CPU capability
(the vector ISA the C++ kernels were built for), and, for graphs on CUDA: the CUDA runtime version, the Triton
version, the GPU name and compute capability.  Recorded only: the driver version, gcc version, CPU model.
A newer driver runs older cubins, so a driver update must not empty a fleet's cache.
:func:`check_environment` refuses, before a load, a manifest whose key fields differ from this machine's.
"""

from __future__ import annotations

import functools
import platform
import subprocess
import sys
from importlib import metadata
from typing import TYPE_CHECKING, Any

import torch

from precompile.errors import EnvironmentMismatchError

if TYPE_CHECKING:  # pragma: no cover
    from precompile.manifest.manifest import Manifest

KEY_FIELDS_ALWAYS = ("torch", "torch_git", "python", "machine", "cpu_capability")
KEY_FIELDS_CUDA = ("cuda", "triton", "gpu_name", "gpu_capability")


@functools.lru_cache(maxsize=None)
def _triton_version() -> str | None:
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        try:
            return metadata.version("pytorch-triton")
        except metadata.PackageNotFoundError:
            return None


@functools.lru_cache(maxsize=None)
def _gcc_version() -> str | None:
    try:
        out = subprocess.run(["gcc", "-dumpfullversion"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


@functools.lru_cache(maxsize=None)
def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _gpu(index: int) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    return {"gpu_name": props.name, "gpu_capability": f"{props.major}.{props.minor}"}


@functools.lru_cache(maxsize=None)
def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def environment(device_types: set[str] | frozenset[str] = frozenset({"cpu"}), cuda_index: int = 0,
                full: bool = True) -> dict[str, Any]:
    """The fingerprint of this process for graphs whose inputs live on ``device_types``.

    Args:
        device_types: device types the graph uses (``{"cpu"}``, ``{"cuda"}``, ``{"cpu", "cuda"}``).
        cuda_index: which GPU's name and compute capability to record.
        full: also the recorded-only fields (gcc, driver, CPU model), which cost a subprocess each;
            False on the load path.

    Returns:
        JSON-ready dict; :func:`key_fields` picks the part that enters the key.
    """
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if full:
        env["cpu_model"] = _cpu_model()
        env["gcc"] = _gcc_version() if "cpu" in device_types else None
    if "cuda" in device_types:
        env.update({
            "cuda": torch.version.cuda,
            "triton": _triton_version(),
            **_gpu(cuda_index),
        })
        if full:
            env["driver"] = _driver_version()
    return env


def key_fields(env: dict[str, Any]) -> dict[str, Any]:
    """The fields of a fingerprint that enter the artifact key (see module docstring)."""
    names = KEY_FIELDS_ALWAYS + (KEY_FIELDS_CUDA if "gpu_capability" in env else ())
    return {k: env.get(k) for k in names}


def mismatches(built: dict[str, Any], here: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(field, built_for, running_on)`` for every key field that differs between two fingerprints."""
    return [(k, built.get(k), here.get(k)) for k in key_fields(built) if built.get(k) != here.get(k)]


def check_environment(manifest: Manifest) -> None:
    """Raise if ``manifest`` was built for an environment whose binaries cannot run here.

    Raises:
        EnvironmentMismatchError: with ``reasons`` = the differing key fields.
    """
    devices = {p["device"] for p in manifest.placeholders if p.get("type") == "tensor"} or {"cpu"}
    here = environment(devices, full=False)
    diff = mismatches(manifest.env, here)
    if diff:
        why = "; ".join(f"{f}: built for {a!r}, running on {b!r}" for f, a, b in diff)
        raise EnvironmentMismatchError(f"artifact {manifest.key[:12]} was built for another environment ({why}); "
                                       "rebuild it here (precompile rebuild) or load it where it was built", diff)
