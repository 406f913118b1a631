"""Names read from an artifact that become paths or imports, checked before any is used (DESIGN.md, "Trust").

A manifest names kernels, wrapper modules and binary files; an unpacked directory's ``index.json`` maps digests to
files; the portable path places binaries at ``kernels[].relpaths``.  Each of these becomes a path under some
directory, so each is checked here, on load and on save, before any file is opened:

- a *plain name* (a kernel, a wrapper module, a file): 1-255 characters (a file name's limit) of ``[A-Za-z0-9_.+-]``,
  not starting with ``.`` (so never ``.`` or ``..``), no separator;
- a *relative path*: 1-8 plain names joined by ``/`` (no leading ``/``, no backslash, no ``..``, no empty part);
- a *module name* (``parts.fast.extern``, ``parts.fast.ops``): dotted Python identifiers.

Every violation is an :class:`~precompile.errors.UnsafePathError` naming the field and the value.  The structure
of the manifest (types of fields, digests, sizes) is checked here too, so that a garbled manifest is an
:class:`~precompile.errors.ArtifactFormatError`, never a ``TypeError`` deep inside a load.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from cache_backends.base import HEX64
from precompile.errors import ArtifactFormatError, UnsafePathError

_PLAIN = re.compile(r"^[A-Za-z0-9_+\-][A-Za-z0-9_.+\-]{0,254}\Z")
#: A name that becomes a file name only through :func:`file_name` (kernel and binary names: Inductor names a
#: kernel after every op it fuses, which can pass 255 characters).
_LONG = re.compile(r"^[A-Za-z0-9_+\-][A-Za-z0-9_.+\-]{0,1023}\Z")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
#: Most parts a relative path may have.
MAX_PARTS = 8


def plain_name(value: object, field: str) -> str:
    """``value`` if it is a plain file name (see the module docstring).

    Raises:
        UnsafePathError: it is not a string, is empty, holds a separator or another character outside
            ``[A-Za-z0-9_.+-]``, starts with ``.`` or is longer than 255 characters.
    """
    if not isinstance(value, str) or not _PLAIN.match(value):
        raise UnsafePathError(f"{field}: {value!r} is not a plain file name (1-255 characters of A-Z a-z 0-9 _ . + -, "
                              "not starting with '.', no '/')", field, value)
    return value


def ascii_identifier(value: object, max_len: int | None = 1024) -> bool:
    """Whether ``value`` is an ASCII Python identifier (keywords included) of at most ``max_len`` characters (None:
    any length).  ASCII, as Python folds other identifier characters to NFKC when it compiles: two different stored
    names could become one."""
    return (isinstance(value, str) and value.isascii() and value.isidentifier()
            and (max_len is None or len(value) <= max_len))


def kernel_name(value: object, field: str) -> str:
    """``value`` if it is an ASCII Python identifier of at most 1024 characters (what a wrapper binds a kernel to;
    ASCII, as Python folds other identifier characters to NFKC when it compiles).

    Raises:
        UnsafePathError: it is not.
    """
    if not ascii_identifier(value, 1024):
        raise UnsafePathError(f"{field}: {value!r} is not a kernel name (an ASCII Python identifier of at most "
                              "1024 characters)", field, value)
    return value


def binary_name(value: object, field: str) -> str:
    """``value`` if it is 1-8 names of ``[A-Za-z0-9_.+-]`` (at most 1024 characters each, not starting with
    ``.``) joined by ``/``: a kernel binary's name, which becomes a path only through :func:`file_name`.

    Raises:
        UnsafePathError: it is not.
    """
    parts = value.split("/") if isinstance(value, str) else []
    if not 1 <= len(parts) <= 8 or not all(_LONG.match(p) for p in parts):
        raise UnsafePathError(f"{field}: {value!r} is not a binary name (1-8 names of A-Z a-z 0-9 _ . + -, "
                              "joined by '/', none starting with '.')", field, value)
    return value


def relative_path(value: object, field: str) -> str:
    """``value`` if it is a relative path of 1-8 plain names joined by ``/``.

    Raises:
        UnsafePathError: it is absolute, holds ``..``, ``.``, an empty part, a backslash or another character a
            plain name cannot hold, or has more than 8 parts.
    """
    if not isinstance(value, str) or not value:
        raise UnsafePathError(f"{field}: {value!r} is not a relative path", field, value)
    parts = value.split("/")
    if value.startswith("/") or len(parts) > MAX_PARTS:
        raise UnsafePathError(f"{field}: {value!r} is not a relative path of at most {MAX_PARTS} parts", field, value)
    for part in parts:
        if not _PLAIN.match(part):
            raise UnsafePathError(f"{field}: {value!r} has a part {part!r} that is not a plain file name (no '..', "
                                  "'.', empty parts or characters outside A-Z a-z 0-9 _ . + -)", field, value)
    return value


def module_name(value: object, field: str) -> str:
    """``value`` if it is a dotted Python module or attribute name (``torch.ops``, ``mylib.ops``).

    Raises:
        UnsafePathError: anything else (a path, an empty string, a relative import).
    """
    if not isinstance(value, str) or not value or not all(_IDENT.match(p) for p in value.split(".")):
        raise UnsafePathError(f"{field}: {value!r} is not a dotted Python name", field, value)
    return value


def inside(base: Path, rel: str, field: str) -> Path:
    """``base / rel`` after checking ``rel`` (:func:`relative_path`) and that the result, with symbolic links
    resolved, stays under ``base``.

    Raises:
        UnsafePathError: ``rel`` is not a safe relative path, or a link under ``base`` leads outside it.
    """
    relative_path(rel, field)
    target = base / rel
    root = base.resolve()
    resolved = target.resolve()
    if resolved != root and root not in resolved.parents:
        raise UnsafePathError(f"{field}: {rel!r} leads outside {base} (to {resolved})", field, rel)
    return target


# ------------------------------------------------------------------------------------------- manifest shape
def _digest(value: object, field: str) -> str:
    if not isinstance(value, str) or not HEX64.match(value):
        raise ArtifactFormatError(f"manifest field {field} is not a digest (64 lowercase hex characters): "
                                  f"{str(value)[:80]!r}")
    return value


def _typed(value: Any, kind: type | tuple[type, ...], field: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) and kind in (int, (int, float)):
        raise ArtifactFormatError(f"manifest field {field} is a {type(value).__name__}, expected "
                                  f"{getattr(kind, '__name__', kind)}")
    return value


def check_manifest(doc: dict[str, Any]) -> None:
    """Check a parsed manifest's structure and every name in it that becomes a path or an import.

    Checks: the type of every top-level field; every blob named by a digest, with an integer size >= 0; every
    digest in ``parts`` and ``kernels`` listed in ``blobs``; every placeholder spec's fields and the ``shapes``
    (symbols, guards) a load reads; wrapper names (plain names), kernel names (Python
    identifiers), binary names, ``relpaths`` (relative paths), ``parts.fast.wrapper`` (a plain name naming a wrapper),
    and the modules of ``parts.fast.extern`` and ``parts.fast.ops`` (dotted names).

    Raises:
        UnsafePathError: a name would become an unsafe path or import.
        ArtifactFormatError: a field has the wrong type, a digest is malformed or not listed in ``blobs``.
    """
    _digest(doc["key"], "key")
    for name, kind in (("factors", dict), ("placeholders", list), ("parts", dict), ("kernels", list),
                       ("autotune", dict), ("alignment", list), ("env", dict), ("blobs", dict), ("build", dict),
                       ("calling", dict), ("shapes", dict)):
        _typed(doc[name], kind, name)
    ambient = doc["factors"].get("ambient")
    if ambient is not None:
        _typed(ambient, dict, "factors.ambient")
    for i, a in enumerate(doc["alignment"]):
        _typed(_typed(a, dict, f"alignment[{i}]").get("index"), int, f"alignment[{i}].index")
    blobs = doc["blobs"]
    for d, info in blobs.items():
        _digest(d, "blobs")
        _typed(_typed(info, dict, f"blobs[{d[:12]}]").get("size"), int, f"blobs[{d[:12]}].size")
        if info["size"] < 0:
            raise ArtifactFormatError(f"manifest field blobs[{d[:12]}].size is negative")

    def named(value: object, field: str) -> None:
        if _digest(value, field) not in blobs:
            raise ArtifactFormatError(f"manifest field {field} names blob {value[:12]}, which is not in its blobs")

    parts = doc["parts"]
    graph = _typed(parts.get("fx_graph"), dict, "parts.fx_graph")
    for sub in ("code", "graph"):
        named(graph.get(sub), f"parts.fx_graph.{sub}")
    named(parts.get("engine_payload"), "parts.engine_payload")
    if parts.get("inductor_config") is not None:
        named(parts["inductor_config"], "parts.inductor_config")
    wrappers = _typed(parts.get("wrappers", {}), dict, "parts.wrappers")
    for name, d in wrappers.items():
        plain_name(name, "parts.wrappers")
        named(d, f"parts.wrappers[{name}]")
    fast = parts.get("fast")
    if fast is not None:
        _check_fast(_typed(fast, dict, "parts.fast"), wrappers, named)
    wgraph = parts.get("wrapper_graph")
    if wgraph is not None:
        _typed(wgraph, dict, "parts.wrapper_graph")
        named(wgraph.get("graph"), "parts.wrapper_graph.graph")
        for idx, d in _typed(wgraph.get("kernels", {}), dict, "parts.wrapper_graph.kernels").items():
            if not (isinstance(idx, str) and idx.isascii() and idx.isdecimal() and len(idx) <= 9):
                raise ArtifactFormatError(f"manifest field parts.wrapper_graph.kernels has key {str(idx)[:20]!r}, "
                                          "not a kernel index")
            named(d, f"parts.wrapper_graph.kernels[{idx}]")
    for i, k in enumerate(doc["kernels"]):
        where = f"kernels[{i}]"
        _typed(k, dict, where)
        kernel_name(k.get("name"), f"{where}.name")
        _typed(k.get("lang"), str, f"{where}.lang")
        named(k.get("source"), f"{where}.source")
        for fname, d in _typed(k.get("binaries"), dict, f"{where}.binaries").items():
            binary_name(fname, f"{where}.binaries")
            named(d, f"{where}.binaries[{fname}]")
        for fname, rel in _typed(k.get("relpaths", {}), dict, f"{where}.relpaths").items():
            binary_name(fname, f"{where}.relpaths")
            relative_path(rel, f"{where}.relpaths[{fname}]")
    for i, spec in enumerate(doc["placeholders"]):
        _check_placeholder(spec, f"placeholders[{i}]")
    shapes = doc["shapes"]
    for name, sym in _typed(shapes.get("symbols") or {}, dict, "shapes.symbols").items():
        _typed(sym, dict, f"shapes.symbols[{str(name)[:20]}]")
    _typed(shapes.get("guards") or "", str, "shapes.guards")
    sig = doc.get("signature")
    if sig is not None:
        _typed(sig, dict, "signature")


#: Largest size, stride or specialized number a placeholder spec may record (int64's range).
_INT64 = 1 << 63


def _check_placeholder(spec: Any, where: str) -> None:
    """A placeholder spec's fields (:class:`~precompile.manifest.manifest.Manifest`): every field a load reads,
    of the type it reads, sizes and strides ints in int64's range or size expressions (strings)."""
    _typed(spec, dict, where)
    _typed(spec.get("name"), str, f"{where}.name")
    _typed(spec.get("kind", ""), str, f"{where}.kind")
    kind = _typed(spec.get("type"), str, f"{where}.type")
    if kind == "tensor":
        _typed(spec.get("dtype"), str, f"{where}.dtype")
        _typed(spec.get("device"), str, f"{where}.device")
        shape = _typed(spec.get("shape"), list, f"{where}.shape")
        stride = _typed(spec.get("stride", shape), list, f"{where}.stride")
        if len(stride) != len(shape):
            raise ArtifactFormatError(f"manifest field {where} has {len(shape)} sizes and {len(stride)} strides")
        for d in (*shape, *stride):
            if not (isinstance(d, str) or type(d) is int and 0 <= d < _INT64):
                raise ArtifactFormatError(f"manifest field {where} has a size or stride {str(d)[:40]!r}, not an "
                                          "int64 >= 0 or a size expression")
        return
    value, size = spec.get("value"), spec.get("size")
    if value is not None and not (type(value) in (int, bool) and -_INT64 <= value < _INT64 or type(value) is float):
        raise ArtifactFormatError(f"manifest field {where}.value is {str(value)[:40]!r}, not a number")
    _typed(size or "", str, f"{where}.size")


def _check_fast(fast: dict[str, Any], wrappers: dict[str, Any], named: Any) -> None:
    plain_name(fast.get("wrapper"), "parts.fast.wrapper")
    if fast["wrapper"] not in wrappers:
        raise ArtifactFormatError(f"parts.fast.wrapper {fast['wrapper']!r} is not one of parts.wrappers")
    if "source" in fast:
        named(fast["source"], "parts.fast.source")
    for name, ref in _typed(fast.get("extern") or {}, dict, "parts.fast.extern").items():
        _typed(name, str, "parts.fast.extern")
        if not isinstance(ref, str) or ref.count(":") != 1:
            raise UnsafePathError(f"parts.fast.extern[{name}]: {ref!r} is not 'module:qualname'",
                                  f"parts.fast.extern[{name}]", ref)
        module, qual = ref.split(":")
        module_name(module, f"parts.fast.extern[{name}]")
        module_name(qual, f"parts.fast.extern[{name}]")
    for i, op in enumerate(_typed(fast.get("ops") or [], list, "parts.fast.ops")):
        _typed(op, dict, f"parts.fast.ops[{i}]")
        _typed(op.get("op"), str, f"parts.fast.ops[{i}].op")
        if op.get("module") is not None:
            module_name(op["module"], f"parts.fast.ops[{i}].module")
    _typed(fast.get("multi_kernel") or {}, dict, "parts.fast.multi_kernel")
    for i in _typed(fast.get("mutated") or [], list, "parts.fast.mutated"):
        _typed(i, int, "parts.fast.mutated")


def file_name(name: str, suffix: str = "") -> str:
    """``name + suffix`` as one file name of at most 255 characters: a longer one keeps its first 200 characters
    and gets the sha256 of the whole name instead of the rest (Inductor names kernels after every op they fuse,
    and such a name plus ``.launch`` can pass the file-name limit).  ``name`` is a checked kernel or binary
    name (:func:`kernel_name`, :func:`binary_name` part)."""
    whole = name + suffix
    if len(whole) <= 255:
        return whole
    import hashlib

    return f"{name[:200]}-{hashlib.sha256(whole.encode()).hexdigest()[:16]}{suffix}"
