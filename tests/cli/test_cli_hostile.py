"""The command line never shows a traceback for what a cache holds (issue 30, finding 4): stored text with rich
markup or terminal controls is printed as text; a malformed entry (a valid digest, but a structure no load would
accept) is listed as malformed while the rest of the cache still lists, and ``inspect`` of it shows what it can and
fails with one line; a path that cannot be an artifact is one line and exit status 2; JSON is parsed with a depth
bound.  Every command runs in a fresh process, ending within 120 s: a limit that shows nothing hangs, generous
for a loaded CI machine (how fast the command starts is not what these tests check)."""

from __future__ import annotations

import json
import os
import socket
import stat
from typing import Any

import pytest
from _cli import cli, error_line, store_variant

from cache_backends.base import digest_bytes
from cache_backends.local.cache import LocalCache

MARKUP = "[/bold]"  # a closing tag with nothing open: rich raises MarkupError for it when read as markup
NASTY = f"{MARKUP} [/] [red]x[/blue] :smile: \x1b[31mred\x1b[0m"
WIDE = {"COLUMNS": "400"}  # tables wide enough that no cell is wrapped


def run(*args: str, code: int | None = 0, env: dict | None = None) -> Any:
    """``precompile ARGS`` in a fresh process: no traceback, the exit status ``code`` (any non-zero for -1)."""
    proc = cli(*args, env={**WIDE, **(env or {})}, check=False, timeout=120)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    if code == -1:
        assert proc.returncode != 0, proc.stdout
    elif code is not None:
        assert proc.returncode == code, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def good_manifest(cache_dir) -> tuple[str, dict[str, Any]]:
    cache = LocalCache(cache_dir)
    key, digest = next(iter(cache.iter_refs()))
    return key, json.loads(cache.get_blob(digest))


def plant(cache_dir, raw: bytes | dict[str, Any], salt: str) -> str:
    """Store ``raw`` (a manifest dict, its ``key`` set to the new key, or bytes) under a new key; every digest valid."""
    key = digest_bytes(salt.encode())
    if isinstance(raw, dict):
        raw = json.dumps({**raw, "key": key} if "key" in raw else raw).encode()
    cache = LocalCache(cache_dir)
    cache.set_ref(key, cache.put_blob(raw))
    return key


def _set(path: str, value: Any):
    def edit(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if value is KeyError:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return edit


def function_manifest(dynamo: str, text: str) -> dict[str, Any]:
    """A well-formed whole-function manifest whose free-text fields hold ``text``."""
    return {"schema": 3, "kind": "function", "key": "0" * 64,
            "factors": {"function": {"module": text, "qualname": text, "source": text}, "options": {text: text}},
            "parts": {"dynamo": dynamo}, "graphs": {"__compiled_fn_1": "1" * 64},
            "sources": [{"module": "json", "first": 1, "last": 2, "sha256": "2" * 64}],
            "frames": [{"code": text, "guards": [text, "x > 1"]}], "env": {text: text},
            "blobs": {dynamo: {"size": 1, "role": "dynamo"}},
            "build": {"created": text, "function": text, "seconds": text, "torch": text}}


def record_manifest(text: str) -> dict[str, Any]:
    return {"schema": 3, "kind": "record", "key": "0" * 64, "purpose": "test_fact",
            "factors": {"format": 3, "kind": "record", "purpose": "test_fact", "about": text},
            "data": {text: [text]}, "blobs": {}, "build": {"created": text}}


MARKUP_EDITS = {
    "dtype": "placeholders.0.dtype", "device": "placeholders.0.device", "placeholder name": "placeholders.0.name",
    "fqn": "placeholders.0.fqn", "shape": "placeholders.0.shape", "created": "build.created",
    "fast_off": "build.fast_off", "host_code": "build.host_code", "seconds": "build.seconds",
    "precompile": "build.precompile", "env value": "env.torch", "option": "factors.options",
    "ambient": "factors.ambient.grad", "tuned": "autotune.tuned", "other picks": "autotune.other",
    "signature": "signature",
}


def test_stored_markup_and_controls_are_printed_as_text(cache_copy):
    d = cache_copy()
    good, doc = good_manifest(d)
    stored = len(list(LocalCache(d).iter_refs()))  # the session cache may hold other tests' artifacts by now
    keys = {}
    for name, path in MARKUP_EDITS.items():
        value: Any = NASTY
        if name in ("option", "other picks"):
            value = {NASTY: NASTY}
        elif name == "tuned":
            value = [{"op": NASTY, "inputs": [NASTY], "chosen": NASTY, "by": NASTY,
                      "candidates": [{"choice": NASTY, "kind": NASTY, "config": {NASTY: 1}, "ms": 1.0}]}]
        elif name == "signature":
            value = {"alg": NASTY, "key_id": NASTY, "public_key": NASTY, "value": NASTY}
        variant = json.loads(json.dumps(doc))
        _set(path, value)(variant)
        keys[name] = plant(d, variant, name)
    keys["function"] = plant(d, function_manifest(LocalCache(d).put_blob(b"x"), NASTY), "function")
    keys["record"] = plant(d, record_manifest(NASTY), "record")
    url = f"file://{d}"
    out = run("ls", "--cache", url).stdout
    assert good[:16] in out and all(k[:16] in out for k in keys.values())
    assert "\x1b[31m" not in out and "\\x1b[31mred" in out  # controls shown escaped, never sent to the terminal
    listed = json.loads(run("ls", "--json", "--cache", url).stdout)
    assert len(listed) == len(keys) + stored
    bad = {it["key"]: it["error"] for it in listed if "error" in it}
    well_formed = {"dtype", "device", "placeholder name", "fqn", "created", "fast_off", "host_code", "seconds",
                   "precompile", "env value", "option", "ambient", "tuned", "other picks", "function", "record"}
    assert not [n for n in well_formed if keys[n] in bad], bad  # markup alone is no fault
    for name, key in keys.items():
        proc = run("inspect", key, "--cache", url, code=None)
        if key in bad:
            assert proc.returncode == 1 and "is malformed" in error_line(proc), (name, proc.stderr)
        else:
            assert proc.returncode == 0, (name, proc.stderr)
            assert MARKUP in proc.stdout and "\x1b[31m" not in proc.stdout, name
    assert MARKUP in run("diff", good, keys["option"], "--cache", url).stdout
    run("explain", keys["option"], "--cache", url)


LONE = "\udc80 \ud800 \udc9b"  # lone surrogates, as JSON's "\\udc80" reads; \udc9b would be CSI as a raw byte


def test_text_stdout_cannot_encode_is_printed_escaped(cache_copy):
    """Lone surrogates in stored fields (issue 34: one in ``build.created`` failed ``ls`` for the whole cache on a
    strict UTF-8 stdout) and, under an ASCII locale, any non-ASCII text: every listing and printing command
    prints them escaped and exits as it would without them."""
    d = cache_copy()
    good, doc = good_manifest(d)
    url = f"file://{d}"
    text = LONE + " caf\u00e9"
    created = store_variant(url, good, _set("build.created", text))
    option = store_variant(url, good, _set("factors.options", {text: text}))
    placeholder = store_variant(url, good, _set("placeholders.0.dtype", text))
    function = plant(d, function_manifest(LocalCache(d).put_blob(b"x"), text), "lone function")
    record = plant(d, record_manifest(text), "lone record")
    env = {"PYTHONIOENCODING": "utf-8"}  # strict: Python's own default for a UTF-8 locale is surrogateescape
    escaped = "\\udc80 \\ud800 \\udc9b"
    out = run("ls", "--cache", url, env=env).stdout
    assert escaped in out and "\x9b" not in out and all(k[:16] in out for k in (created, function, record))
    listed = {it["key"]: it for it in json.loads(run("ls", "--json", "--cache", url, env=env).stdout)}
    assert listed[created]["created"] == text  # JSON escapes it (\udc80): consumers read back what was stored
    for key in (created, option, placeholder, function, record):
        assert escaped in run("inspect", key, "--cache", url, env=env).stdout, key
        assert json.loads(run("inspect", key, "--json", "--cache", url, env=env).stdout)["key"] == key
    assert escaped in run("diff", good, option, "--cache", url, env=env).stdout
    run("explain", option, "--cache", url, env=env)
    run("stats", "--cache", url, env=env)
    verify = run("verify", "--cache", url, env=env, code=1)  # the planted function and record are refs to fix
    assert "Traceback" not in verify.stdout and function[:16] in verify.stdout
    ascii_env = {"PYTHONIOENCODING": "ascii"}  # what the encoding cannot hold is escaped too
    assert "caf\\xe9" in run("ls", "--cache", url, env=ascii_env).stdout
    assert "caf\\xe9" in run("inspect", created, "--cache", url, env=ascii_env).stdout


STRUCTURAL = {
    "no placeholders": _set("placeholders", KeyError), "blobs a list": _set("blobs", []),
    "placeholders a dict": _set("placeholders", {}), "a placeholder an int": _set("placeholders.0", 7),
    "a placeholder without kind": _set("placeholders.0.kind", KeyError), "build a list": _set("build", []),
    "factors a string": _set("factors", "x"), "no fx_graph": _set("parts.fx_graph", KeyError),
    "kernels an object": _set("kernels", {"a": 1}), "a kernel a string": _set("kernels.0", "k"),
    "a blob size a string": lambda d: d["blobs"][next(iter(d["blobs"]))].update(size="9"),
    "alignment of strings": _set("alignment", ["x"]), "env a list": _set("env", [1]),
    "schema 99": _set("schema", 99), "symbols a list": _set("shapes", {"symbols": {"s0": 3}}),
    "ambient a list": _set("factors.ambient", [1]), "a kernel name with a path": _set("kernels.0.name", "../x"),
    "tuned garbage": _set("autotune.tuned", [1, "x", {"candidates": 5}]),
}
RAW = {"a JSON array": b"[1, 2]", "not JSON": b"{not json", "not UTF-8": b"\xff\xfe{}",
       "200k deep": b"[" * 200_000 + b"]" * 200_000, "a JSON string": b'"manifest"',
       "function graphs a list": None, "record data a list": None}


def test_a_malformed_entry_is_listed_as_such_and_the_rest_still_lists(cache_copy):
    d = cache_copy()
    good, doc = good_manifest(d)
    keys = {}
    for name, edit in STRUCTURAL.items():
        variant = json.loads(json.dumps(doc))
        edit(variant)
        keys[name] = plant(d, variant, name)
    for name, raw in RAW.items():
        if name == "function graphs a list":
            raw = {**function_manifest(LocalCache(d).put_blob(b"x"), "f"), "graphs": ["x"]}
        elif name == "record data a list":
            raw = {**record_manifest("r"), "data": [1]}
        keys[name] = plant(d, raw, name)
    url = f"file://{d}"
    listed = {it["key"]: it for it in json.loads(run("ls", "--json", "--cache", url).stdout)}
    assert "error" not in listed[good] and listed[good]["kind"] == "graph"
    # fields a listing does not read may be odd and still list; inspect finds them (a size symbol that is not an
    # object is caught by the manifest's structure check since the second probe: a load reads symbols)
    listable = {"tuned garbage"}
    assert {n for n, k in keys.items() if "error" not in listed[k]} == listable
    out = run("ls", "--cache", url).stdout
    assert good[:16] in out and out.count("malformed") >= len(keys) - len(listable)
    for name, key in keys.items():
        proc = run("inspect", key[:12], "--cache", url, code=None)
        if name == "tuned garbage":  # the picks table skips what is not shaped like a pick
            assert proc.returncode == 0, proc.stderr
            continue
        assert proc.returncode == 1, (name, proc.stdout, proc.stderr)
        line = error_line(proc)
        assert key in line and ("malformed" in line or "not a readable JSON manifest" in line
                                or "not a JSON object" in line), (name, line)
        if name not in listable and isinstance(RAW.get(name, {}), dict):  # parsed: what can be shown is shown
            assert "malformed" in proc.stdout and key in proc.stdout, (name, proc.stdout)
        elif name in listable:
            assert key in proc.stdout, (name, proc.stdout)  # its first lines were printed
        if name in ("no placeholders", "200k deep", "symbols a list"):  # --json: the stored JSON as is, if parsed
            run("inspect", key, "--json", "--cache", url, code=0 if name in listable else 1)
    # the commands that read every manifest skip the malformed ones
    run("explain", good, "--cache", url)
    assert "malformed" in error_line(run("diff", good, keys["no placeholders"], "--cache", url, code=1))
    verify = json.loads(run("verify", "--json", "--cache", url, code=1).stdout.strip().splitlines()[-1])
    assert not verify["ok"]


@pytest.mark.parametrize("what", ["/proc/self/mem", "/dev/zero", "/dev/null", "a directory", "a FIFO", "a socket",
                                  "a symlink to /dev/zero"])
def test_inspect_of_a_path_that_cannot_be_an_artifact_is_one_line_and_exit_2(what, tmp_path):
    path = {"/proc/self/mem": "/proc/self/mem", "/dev/zero": "/dev/zero", "/dev/null": os.devnull}.get(what)
    held = None
    if what == "a directory":
        path = str(tmp_path)
    elif what == "a FIFO":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    elif what == "a socket":
        path = str(tmp_path / "sock")
        held = socket.socket(socket.AF_UNIX)
        held.bind(path)
    elif what == "a symlink to /dev/zero":
        path = str(tmp_path / "link.pc")
        os.symlink("/dev/zero", path)
    try:
        every = what in ("/proc/self/mem", "a FIFO")
        for args in [["inspect", path]] + ([["inspect", path, "--json"], ["diff", path, path], ["explain", path]]
                                           if every else []):
            proc = run(*args, "--cache", f"file://{tmp_path}", code=2)
            assert path in error_line(proc) and proc.stdout == ""
    finally:
        if held is not None:
            held.close()


def test_a_bad_key_setting_is_exit_2_for_every_command_that_reads(cache_copy, tmp_path):
    d = cache_copy()
    good, _ = good_manifest(d)
    url = f"file://{d}"
    saved = tmp_path / "a.pc"
    cli("export", good, "-o", str(tmp_path / "b.pcb"), "--cache", url, timeout=30)
    (tmp_path / "empty.keys").write_text("# nobody yet\n")
    every = (["ls"], ["inspect", good], ["stats"], ["verify"], ["diff", good], ["explain", good], ["gc", "--older-than",
             "1d", "--dry-run"], ["export", good, "-o", str(tmp_path / "c.pcb")], ["import", str(tmp_path / "b.pcb")])
    for env in ({"PRECOMPILE_VERIFY_KEYS": ","}, {"PRECOMPILE_VERIFY_KEYS": str(tmp_path / "empty.keys")},
                {"PRECOMPILE_VERIFY_KEYS": os.devnull}, {"PRECOMPILE_SIGNING_KEY": " "}):
        for args in every if env.get("PRECOMPILE_VERIFY_KEYS") == "," else (["ls"], ["inspect", good]):
            line = error_line(run(*args, "--cache", url, code=2, env=env))
            assert "PRECOMPILE_" in line, line
    assert not (tmp_path / "c.pcb").exists()
    for bad in ("verify_keys=", "verify_keys=,", f"verify_keys={tmp_path / 'empty.keys'}", "signing_key="):
        for u in (f"{url}?{bad}", f"{url}|file://{tmp_path / 'far'}?{bad}"):
            assert "of cache URL" in error_line(run("ls", "--cache", u, code=2))
    # inspect of a file with a key setting that names no key: exit 2 (it used to print "not checked" and exit 0)
    import precompile

    precompile.load(good, cache=url).save(saved)
    line = error_line(run("inspect", str(saved), env={"PRECOMPILE_VERIFY_KEYS": ","}, code=2))
    assert "names no key" in line


def _not_a_file(what: str, tmp_path) -> tuple[str, Any]:
    """A path in ``tmp_path`` holding ``what`` (never a real device node: a copy of /dev/full's numbers, made here
    as root), and what holds it open."""
    path, held = str(tmp_path / what.replace(" ", "_")), None
    if what == "a directory":
        os.mkdir(path)
    elif what == "a FIFO":
        os.mkfifo(path)
    elif what == "a socket":
        held = socket.socket(socket.AF_UNIX)
        held.bind(path)
    elif what == "a device":
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        except PermissionError:
            pytest.skip("a device node can be made only as root")
    elif what == "a symlink":
        (tmp_path / "target").write_bytes(b"kept")
        os.symlink(tmp_path / "target", path)
    return path, held


NOT_FILES = ["a directory", "a FIFO", "a socket", "a device", "a symlink"]


@pytest.mark.parametrize("what", NOT_FILES)
def test_export_never_writes_or_replaces_anything_but_a_regular_file(what, cache_copy, tmp_path):
    """``export -o`` a directory once failed with a traceback; as root, ``-o /dev/full`` replaced the device node
    with a regular file.  Now: one line, exit status 2, and what was there is still there, untouched."""
    d = cache_copy()
    good, _ = good_manifest(d)
    path, held = _not_a_file(what, tmp_path)
    before = os.lstat(path)
    try:
        for out in [path] + ([path + "/"] if what == "a directory" else [f"{path}/b.pcb"] if what == "a FIFO" else []):
            line = error_line(run("export", good, "-o", out, "--cache", f"file://{d}", code=2))
            assert "cannot write bundle" in line and path in line, line
        after = os.lstat(path)
        assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)
        assert not list(tmp_path.glob(".*incomplete")) and (what != "a symlink" or
                                                            (tmp_path / "target").read_bytes() == b"kept")
    finally:
        if held is not None:
            held.close()


@pytest.mark.parametrize("what", ["/proc/self/mem", *NOT_FILES[:-1]])
def test_import_of_a_path_that_cannot_be_a_bundle_is_one_line_and_exit_2(what, tmp_path):
    path, held = (what, None) if what.startswith("/") else _not_a_file(what, tmp_path)
    try:
        line = error_line(run("import", path, "--cache", f"file://{tmp_path}/cache", code=2))
        assert path in line and "nothing was imported" in line, line
    finally:
        if held is not None:
            held.close()
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("ref/*"))
