"""Why two keys differ: their stored factors compared one by one (DESIGN.md, "Keys": a miss always has a
visible reason).

Every artifact's manifest stores the factors its key hashes (docs/format.md, "The key"), so two artifacts are
compared without compiling anything: :func:`compare` lists each factor that differs (an input's dtype, shape,
stride or alignment, an option, an ambient setting, a field of the environment...), with the graph's readable
code diffed when the graph differs and Inductor's effective config diffed entry by entry when its digest does.
:func:`nearest` ranks stored artifacts by how close their factors are to a target's: why a key misses.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

from cache_backends.bounded import loads_json
from precompile.store.lookup import Source

#: Largest stored JSON part (Inductor config, wrapper graph) parsed for a diff, bytes; a larger one is not diffed.
MAX_PART_JSON_BYTES = 64 << 20

#: Factors in the order they are shown; any other factor follows, sorted.
FACTOR_ORDER = ("format", "graph", "inputs", "symbols", "options", "inductor_config", "ambient", "env",
                "dynamic_shapes", "calling")

_ENV_WHAT = {"torch": "torch build", "torch_git": "torch build", "gpu_name": "GPU", "gpu_capability": "GPU",
             "cuda": "CUDA", "triton": "Triton", "cpu_capability": "CPU ISA", "python": "Python",
             "machine": "machine"}
_INPUT_WHAT = {"dtype": "input dtype", "shape": "input shape", "stride": "input stride", "aligned": "input alignment",
               "device_index": "input device index",
               "requires_grad": "input requires_grad", "device": "input device", "kind": "input kind",
               "type": "input type", "value": "specialized number", "size": "symbolic size"}


@dataclass(frozen=True)
class Change:
    """One factor that differs.

    Attributes:
        factor: the top-level factor (``"inputs"``, ``"env"``...).
        path: where inside it, e.g. ``"inputs[0] l_x_ .dtype"``, ``"env.torch"``, ``"options.max_autotune"``.
        what: what kind of difference, in words (``"input dtype"``, ``"torch build"``, ``"compile option"``).
        a / b: the two values (None where one side lacks the entry).
    """

    factor: str
    path: str
    what: str
    a: Any
    b: Any

    def to_dict(self) -> dict[str, Any]:
        return {"factor": self.factor, "path": self.path, "what": self.what, "a": self.a, "b": self.b}

    def sentence(self) -> str:
        """``"input dtype inputs[0] (l_x_).dtype: 'float32' vs 'float16'"``."""
        return f"{self.what} {self.path}: {_short(self.a)} vs {_short(self.b)}"


@dataclass
class Comparison:
    """Everything that differs between artifacts ``a`` and ``b``.

    Attributes:
        changes: one :class:`Change` per differing leaf, in :data:`FACTOR_ORDER`.
        graph_diff: unified diff of the two graphs' readable code when the graph differs ("" otherwise, or when
            a side's code part is not readable).
        config_changes: Inductor config entries that differ when the ``inductor_config`` digest does.
        pick_changes: tuned ops (GEMM, convolution) whose chosen candidate differs (:func:`pick_changes`);
            picks are outcomes of a build, not key factors.
        wrapper_diff: unified diff of the two wrapper graphs, node by node
            (:func:`precompile.manifest.wrapper.text.describe`), when both are stored as data and differ ("" otherwise).
    """

    a: str
    b: str
    changes: list[Change] = field(default_factory=list)
    graph_diff: str = ""
    config_changes: list[Change] = field(default_factory=list)
    pick_changes: list[Change] = field(default_factory=list)
    wrapper_diff: str = ""

    @property
    def factors(self) -> list[str]:
        """The top-level factors that differ, in order."""
        return list(dict.fromkeys(c.factor for c in self.changes))

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "same": not self.changes, "factors": self.factors,
                "changes": [c.to_dict() for c in self.changes], "graph_diff": self.graph_diff,
                "inductor_config_changes": [c.to_dict() for c in self.config_changes],
                "pick_changes": [c.to_dict() for c in self.pick_changes], "wrapper_diff": self.wrapper_diff}


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _ordered(names: set[str]) -> list[str]:
    return [n for n in FACTOR_ORDER if n in names] + sorted(names - set(FACTOR_ORDER))


def _what(factor: str, path: list[Any]) -> str:
    if factor == "env":
        return _ENV_WHAT.get(str(path[0]) if path else "", "environment")
    if factor == "inputs":
        return _INPUT_WHAT.get(str(path[1]) if len(path) > 1 else "", "inputs")
    return {"options": "compile option", "ambient": "ambient state", "symbols": "size range", "graph": "graph",
            "inductor_config": "Inductor config", "dynamic_shapes": "dynamic shapes", "calling": "calling convention",
            "format": "format version"}.get(factor, factor)


def _walk(factor: str, a: Any, b: Any, path: list[Any], names: list[str], out: list[Change]) -> None:
    if a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            _walk(factor, a.get(k), b.get(k), [*path, k], names, out)
        return
    if factor == "inputs" and not path and isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(Change(factor, "inputs", "number of inputs", len(a), len(b)))
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(factor, x, y, [i], names, out)
        return
    out.append(Change(factor, _path_text(factor, path, names), _what(factor, path), a, b))


def _path_text(factor: str, path: list[Any], names: list[str]) -> str:
    text = factor
    for i, p in enumerate(path):
        if factor == "inputs" and i == 0 and isinstance(p, int):
            text += f"[{p}]" + (f" ({names[p]})" if p < len(names) and names[p] else "")
        else:
            text += f".{p}"
    return text


def factor_changes(a: dict[str, Any], b: dict[str, Any], names: list[str] | None = None) -> list[Change]:
    """Each leaf where factor dicts ``a`` and ``b`` differ, in :data:`FACTOR_ORDER`.

    Args:
        names: placeholder names of ``a``, to label inputs (``inputs[0] (l_x_).dtype``).
    """
    out: list[Change] = []
    for factor in _ordered(set(a) | set(b)):
        _walk(factor, a.get(factor), b.get(factor), [], names or [], out)
    return out


def _names(manifest: dict[str, Any]) -> list[str]:
    return [str(p.get("name", "")) for p in manifest.get("placeholders") or [] if isinstance(p, dict)]


def _part(manifest: dict[str, Any], *path: str) -> str | None:
    node: Any = manifest.get("parts") or {}
    for p in path:
        node = node.get(p) if isinstance(node, dict) else None
    return node if isinstance(node, str) else None


def compare(a: Source, b: Source, *, context: int = 2) -> Comparison:
    """Compare two artifacts factor by factor, reading the parts the graph and config diffs need.

    Args:
        context: lines of context in the graph code diff.
    """
    fa, fb = a.manifest.get("factors") or {}, b.manifest.get("factors") or {}
    out = Comparison(a.key, b.key, factor_changes(fa, fb, _names(a.manifest)))
    if fa.get("graph") != fb.get("graph"):
        code_a, code_b = (s.part_text(_part(s.manifest, "fx_graph", "code")) for s in (a, b))
        if code_a is not None and code_b is not None:
            out.graph_diff = "".join(difflib.unified_diff(
                code_a.splitlines(keepends=True), code_b.splitlines(keepends=True),
                fromfile=f"graph of {a.key[:12]}", tofile=f"graph of {b.key[:12]}", n=context))
    if fa.get("inductor_config") != fb.get("inductor_config"):
        cfg = []
        for s in (a, b):
            text = s.part_text(_part(s.manifest, "inductor_config"))
            try:
                cfg.append(loads_json(text, MAX_PART_JSON_BYTES, "Inductor config") if text else None)
            except ValueError:  # not JSON, or past the bounds
                cfg.append(None)
        if isinstance(cfg[0], dict) and isinstance(cfg[1], dict):
            for name in sorted(set(cfg[0]) | set(cfg[1])):
                if cfg[0].get(name) != cfg[1].get(name):
                    out.config_changes.append(Change("inductor_config", f"inductor_config.{name}", "Inductor config",
                                                     cfg[0].get(name), cfg[1].get(name)))
    out.pick_changes = pick_changes(a.manifest, b.manifest)
    out.wrapper_diff = _wrapper_diff(a, b, context)
    return out


def _wrapper_diff(a: Source, b: Source, context: int) -> str:
    """Unified diff of two stored wrapper graphs' readable forms; "" when either has none, they are the same part,
    or one is refused by its checks (then ``inspect --wrapper`` says why)."""
    from precompile.manifest.wrapper.text import describe

    texts = []
    for s in (a, b):
        d = _part(s.manifest, "wrapper_graph", "graph")
        raw = s.part_text(d) if d else None
        if raw is None:
            return ""
        try:
            texts.append(describe(loads_json(raw, MAX_PART_JSON_BYTES, "wrapper graph")))
        except (ValueError, RecursionError):
            return ""
    if texts[0] == texts[1]:
        return ""
    return "".join(difflib.unified_diff(texts[0].splitlines(keepends=True), texts[1].splitlines(keepends=True),
                                        fromfile=f"wrapper of {a.key[:12]}", tofile=f"wrapper of {b.key[:12]}",
                                        n=context))


def _tuned(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"mm(32x16384 float32, 16384x64 float32)": record}`` of a manifest's tuned ops; a second op of the same
    name and inputs gets ``#2``, and so on."""
    out: dict[str, dict[str, Any]] = {}
    tuned = (manifest.get("autotune") or {}).get("tuned") if isinstance(manifest.get("autotune"), dict) else None
    for op in tuned if isinstance(tuned, list) else []:
        if not isinstance(op, dict):
            continue
        inputs = op.get("inputs") if isinstance(op.get("inputs"), list) else []
        name = f"{op.get('op')}({', '.join(map(str, inputs))})"
        n = 2
        base = name
        while name in out:
            name, n = f"{base} #{n}", n + 1
        out[name] = op
    return out


def pick_text(op: dict[str, Any]) -> str | None:
    """A tuned op's pick as its kind and config (``"decompose_k k_split=64"``, ``"extern extern_kernels.mm"``,
    ``"triton template num_stages=3, num_warps=4, tile_shape=(32, 64, 128)"``): Inductor's choice names carry a
    per-process counter (``triton_mm_12``), so two builds are compared by what was picked, not by its name."""
    chosen = op.get("chosen")
    cands = op.get("candidates") if isinstance(op.get("candidates"), list) else []
    cand = next((c for c in cands if isinstance(c, dict) and c.get("choice") == chosen), None)
    if chosen is None or cand is None:
        return None if chosen is None else str(chosen)
    config = cand.get("config") if isinstance(cand.get("config"), dict) else {}
    text = " ".join([str(cand.get("kind")), ", ".join(f"{k}={v}" for k, v in sorted(config.items()))]).strip()
    return text if op.get("by") in (None, "benchmark") else f"{text} (by {op.get('by')})"


def pick_changes(a: dict[str, Any], b: dict[str, Any]) -> list[Change]:
    """The tuned ops whose pick differs between manifests ``a`` and ``b`` (matched by op name and input sizes;
    picks compared by :func:`pick_text`), and ops only one of them tuned (that side's value ``"(not tuned)"``),
    as :class:`Change` s of factor ``"autotune"``."""
    ta, tb = _tuned(a), _tuned(b)
    out = []
    for name in list(dict.fromkeys([*ta, *tb])):
        va = "(not tuned)" if name not in ta else pick_text(ta[name]) or "(no pick)"
        vb = "(not tuned)" if name not in tb else pick_text(tb[name]) or "(no pick)"
        if va != vb:
            out.append(Change("autotune", f"autotune.tuned {name}", "tuned pick", va, vb))
    return out


@dataclass
class Near:
    """A stored artifact near a target: its key and the factor changes from the target to it."""

    key: str
    changes: list[Change]

    @property
    def factors(self) -> list[str]:
        return list(dict.fromkeys(c.factor for c in self.changes))

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "factors": self.factors, "changes": [c.to_dict() for c in self.changes]}

    def reason(self, limit: int = 3) -> str:
        """The first ``limit`` changes as one line (``"differs in env (torch build env.torch: ...)"``)."""
        shown = "; ".join(c.sentence() for c in self.changes[:limit])
        more = f"; and {len(self.changes) - limit} more" if len(self.changes) > limit else ""
        return f"differs in {', '.join(self.factors)}: {shown}{more}"


def nearest(factors: dict[str, Any], stored: list[tuple[str, dict[str, Any] | None]], *, exclude: str | None = None,
            names: list[str] | None = None, count: int = 3) -> list[Near]:
    """The ``count`` stored artifacts whose factors are closest to ``factors``: fewest differing top-level
    factors, then fewest differing leaves, then key order.  Entries whose manifest is unreadable or of another kind
    (graph or whole-function), and ``exclude`` (the target itself), are skipped."""
    ranked = []
    for key, manifest in stored:
        if manifest is None or key == exclude or not isinstance(manifest.get("factors"), dict):
            continue
        if manifest.get("kind") != factors.get("kind"):  # a whole-function artifact is compared with its kind only
            continue
        changes = factor_changes(factors, manifest["factors"], names)
        ranked.append((len({c.factor for c in changes}), len(changes), key, changes))
    ranked.sort(key=lambda r: r[:3])
    return [Near(key, changes) for _, _, key, changes in ranked[:count]]


def explain_miss(key: str, factors: dict[str, Any], stored: list[tuple[str, dict[str, Any] | None]],
                 names: list[str] | None = None) -> str:
    """One line for a miss of ``key``: the closest stored artifact and what differs from it.

    ``stored`` is :func:`precompile.store.lookup.stored_manifests` of the cache that missed."""
    near = nearest(factors, stored, exclude=key, names=names, count=1)
    if not near:
        return f"miss {key[:12]}: the cache holds no other artifact to compare with"
    n = sum(1 for k, m in stored if m is not None and k != key and m.get("kind") == factors.get("kind"))
    return f"miss {key[:12]}: closest of {n} stored artifacts is {near[0].key[:12]}, which {near[0].reason()}"


def function_status(manifest: dict[str, Any]) -> str | None:
    """For a stored whole-function manifest, why a process would not simply hit it, in a sentence: stored as
    refused (and why), or frames left out of it (traced at run time, and why); None when neither, or for a graph
    manifest.  (A changed source and guards that refuse a call depend on the loading process: its ``miss_reason``
    says those.)"""
    if manifest.get("kind") != "function" or not isinstance(manifest.get("build"), dict):
        return None
    build = manifest["build"]
    if isinstance(build.get("refused"), str):
        return f"stored as refused: its builder could not store it: {build['refused']}"
    left_out = build.get("left_out")
    if isinstance(left_out, dict) and left_out:
        frames = "; ".join(f"{k}: {'; '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in left_out.items())
        return f"stored with frames left out (traced at run time in every process): {frames}"
    return None
