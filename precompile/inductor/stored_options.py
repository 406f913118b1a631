"""Inductor options read from an artifact, as data: each has a type and a value domain, checked before any is applied.

A manifest's ``factors.options`` is what its builder passed to Inductor, and ``precompile rebuild`` applies it again.
Read from a cache, it is whatever whoever wrote the cache put there, and some Inductor options reach a command line
or a path (``cpp.march`` is pasted into g++'s arguments as ``-march=<value>``; ``cuda.compile_opt_level`` into
nvcc's; ``trace.debug_dir``, ``cuda.cutlass_dir``, ``cpp.cxx`` name files and programs).  So a stored option is
applied only where its value lies in its domain (:func:`check`):

- the name is an Inductor config option of this torch;
- a string is one of a fixed set: the option's ``Literal`` values where Inductor declares them, else
  :data:`STRING_DOMAINS` (``cpp.march`` from gcc's documented ``-march``/``-mcpu`` names); any other string option
  (paths, programs, regular expressions, free text) is refused;
- otherwise the value has the option's declared type (bool, int, float, None where the type admits it, a list of
  ints): an int within int32, a finite float, at most :data:`MAX_ITEMS` items; dicts, callables and objects never.

What falls outside is refused, named with its value, and a rebuild leaves that option at this machine's default.
"""

from __future__ import annotations

import math
import re
import types
import typing
from typing import Any

from precompile.errors import OptionsError

MAX_ITEMS = 64
INT_RANGE = (-(2**31), 2**31 - 1)
#: Ranges tighter than :data:`INT_RANGE`: thread counts (a huge one would start that many compile workers).
INT_RANGES = {"compile_threads": (1, 1024), "cpp.threads": (-1, 4096)}

#: ``-march`` names of gcc's x86 options (gcc.gnu.org/onlinedocs/gcc/x86-Options.html).
_X86 = """native x86-64 x86-64-v2 x86-64-v3 x86-64-v4 i386 i486 i586 pentium lakemont pentium-mmx pentiumpro i686
pentium2 pentium3 pentium3m pentium-m pentium4 pentium4m prescott nocona core2 nehalem corei7 westmere sandybridge
corei7-avx ivybridge core-avx-i haswell core-avx2 broadwell skylake skylake-avx512 cascadelake cannonlake cooperlake
icelake-client icelake-server tigerlake rocketlake alderlake raptorlake meteorlake gracemont arrowlake arrowlake-s
lunarlake pantherlake sapphirerapids emeraldrapids graniterapids graniterapids-d diamondrapids bonnell atom
silvermont slm goldmont goldmont-plus tremont sierraforest grandridge clearwaterforest knl knm k6 k6-2 k6-3 athlon
athlon-tbird athlon-4 athlon-xp athlon-mp k8 opteron athlon64 athlon-fx k8-sse3 opteron-sse3 athlon64-sse3 amdfam10
barcelona bdver1 bdver2 bdver3 bdver4 znver1 znver2 znver3 znver4 znver5 btver1 btver2 lujiazui yongfeng
shijidadao""".split()
#: ``-march`` architectures of gcc's AArch64 options (gcc.gnu.org/onlinedocs/gcc/AArch64-Options.html), which may
#: carry ``+feature`` / ``+nofeature`` modifiers from :data:`_AARCH64_FEATURES`.
_AARCH64 = """armv8-a armv8.1-a armv8.2-a armv8.3-a armv8.4-a armv8.5-a armv8.6-a armv8.7-a armv8.8-a armv8.9-a armv9-a
armv9.1-a armv9.2-a armv9.3-a armv9.4-a armv9.5-a armv8-r""".split()
_AARCH64_FEATURES = frozenset("""crc crypto fp simd sve lse rdma fp16 fp16fml rcpc rcpc3 dotprod aes sha2 sha3 sm4
profile rng memtag sb ssbs predres sve2 sve2-sm4 sve2-aes sve2-sha3 sve2-bitperm tme i8mm f32mm f64mm bf16 flagm pauth
ls64 mops cssc sme sme-i16i64 sme-f64f64 sme2 faminmax fp8 lut d128 the gcs""".split())
#: What Inductor itself passes on RISC-V (``rv64gc``, ``rv32gc``) and POWER's ``-mcpu`` names (gcc's RS/6000 options).
_OTHER = ["rv64gc", "rv64gcv", "rv32gc", "power8", "power9", "power10", "power11"]
MARCH = frozenset(_X86 + _AARCH64 + _OTHER)

_BACKENDS = frozenset({"ATEN", "TRITON", "CPP", "CUTLASS", "CUTEDSL", "CK", "CKTILE", "NVGEMM"})


def _march(value: str) -> bool:
    if value == "" or value in MARCH:
        return True
    base, *features = value.split("+")
    return base in _AARCH64 and bool(features) and all(f.removeprefix("no") in _AARCH64_FEATURES for f in features)


def _backends(value: str) -> bool:
    items = value.upper().split(",")
    return 0 < len(items) <= len(_BACKENDS) and all(i.strip() in _BACKENDS for i in items)


#: The string options a stored artifact may set that Inductor declares as plain ``str``, each with its fixed domain
#: (a set, or a check of the whole value); options Inductor types as ``Literal`` take their declared values.
STRING_DOMAINS: dict[str, frozenset[str] | typing.Callable[[str], bool]] = {
    "cpp.march": _march,
    "cpp.enable_floating_point_contract_flag": frozenset({"off", "on", "fast"}),
    "cuda.compile_opt_level": frozenset({"-O0", "-O1", "-O2", "-O3"}),
    "xpu.compile_opt_level": frozenset({"-O0", "-O1", "-O2", "-O3"}),
    "layout_opt_default": frozenset({"0", "1"}),
    "estimate_op_runtime": frozenset({"default"}),
    "worker_start_method": frozenset({"subprocess", "fork", "spawn", "forkserver"}),
    "max_autotune_gemm_backends": _backends,
    "max_autotune_conv_backends": _backends,
    "max_autotune_conv_bwd_input_backends": _backends,
    "max_autotune_conv_bwd_weight_backends": _backends,
}
_PLAIN_STRING = re.compile(r"[A-Za-z0-9_.+,-]{0,200}\Z")


def _declared(entry: Any) -> Any:
    """The option's declared type: its ``value_type`` (torch 2.13), else its default's type."""
    declared = getattr(entry, "value_type", None)
    if declared is not None:
        return declared
    default = getattr(entry, "default", None)
    return bool if type(default) is object else type(default)


def _fits(value: Any, declared: Any) -> bool:
    """Whether ``value`` (a JSON value) has type ``declared``, for the forms a stored option may take."""
    origin, args = typing.get_origin(declared), typing.get_args(declared)
    if declared is type(None) or declared is None:
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is typing.Literal:
        return any(type(value) is type(a) and value == a for a in args)
    if declared is bool:
        return isinstance(value, bool)
    if declared is int:
        return isinstance(value, int) and not isinstance(value, bool) and INT_RANGE[0] <= value <= INT_RANGE[1]
    if declared is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value) and abs(value) <= 1e18)
    if origin in (list, tuple) and isinstance(value, list) and len(value) <= MAX_ITEMS:
        inner = [a for a in args if a is not Ellipsis]
        if origin is tuple and Ellipsis not in args and len(inner) != len(value):
            return False
        kinds = inner if origin is tuple and Ellipsis not in args else [inner[0] if inner else None] * len(value)
        return all(k is not str and k is not None and _fits(v, k) for v, k in zip(value, kinds))
    return False


def check(name: Any, value: Any, entries: dict[str, Any]) -> None:
    """Check one stored option against its domain (module docstring).

    Args:
        name: the dotted option name (``"cpp.march"``).
        value: its stored value (a JSON value).
        entries: Inductor's config entries by name (:func:`precompile.inductor.shim.config_entries`).

    Raises:
        OptionsError: naming the option and its value: not an Inductor option, a string outside its fixed set, or a
            value of another type or outside its range.
    """
    shown = f"{name!r:.80} = {value!r:.120}"
    entry = entries.get(name) if isinstance(name, str) else None
    if entry is None:
        raise OptionsError(f"stored option {shown}: not an Inductor option of this torch")
    domain = STRING_DOMAINS.get(name)
    if isinstance(value, str):
        if domain is None:
            if _fits(value, _declared(entry)) and _PLAIN_STRING.match(value):  # a declared Literal value
                return
            raise OptionsError(f"stored option {shown}: a string option a stored artifact may not set (it may name "
                               "a path, a program or a command-line argument)")
        if not (domain(value) if callable(domain) else value in domain):
            raise OptionsError(f"stored option {shown}: not one of the values allowed for {name}")
        return
    low, high = INT_RANGES.get(name, INT_RANGE)
    if isinstance(value, int) and not isinstance(value, bool) and not low <= value <= high:
        raise OptionsError(f"stored option {shown}: outside {low}..{high}")
    if not _fits(value, _declared(entry)):
        raise OptionsError(f"stored option {shown}: not a value of its type ({_declared(entry)})")


def within_domain(options: Any, entries: dict[str, Any]) -> tuple[dict[str, Any], list[OptionsError]]:
    """Split stored options into those within their domains and the refusals for the rest (a rebuild leaves
    those at this machine's defaults, and logs each).  Options that are not an object are all refused."""
    if not isinstance(options, dict):
        return {}, [OptionsError(f"stored options {options!r:.120} are not an object of option names and values")]
    kept: dict[str, Any] = {}
    refused: list[OptionsError] = []
    for name, value in options.items():
        try:
            check(name, value, entries)
        except OptionsError as err:
            refused.append(err)
        else:
            kept[name] = value
    return kept, refused
