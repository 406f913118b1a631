"""The command line never prints a cache URL's secrets (issue 39, part 3): ``stats``, ``ls``, ``inspect``,
``explain`` and ``verify``, in real processes, with each URL form of tests/_secret_urls.py given as ``--cache`` or
as ``PRECOMPILE_CACHE``, against one real redis-server that holds a real artifact: the forms that work list,
inspect and verify it (so every line naming the cache was printed), the others fail with one line."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from _cli import cli
from _secret_urls import forms, names, start_secured

#: The commands (``{key}``: the stored artifact's key).
COMMANDS = (("stats",), ("ls",), ("inspect", "{key}"), ("explain", "{key}"), ("verify",))
#: Forms that work and are run through every command (and ``stats --format prometheus``), with ``--cache`` and
#: ``stats``, ``ls`` with ``PRECOMPILE_CACHE`` too; ``verify`` of a cache that works imports torch (seconds a
#: run): for the first only.
EVERY_COMMAND = ("rediss+ssl_password", "tiered")


def _runs(index: int, name: str, outcome: str) -> list[tuple[tuple[str, ...], bool]]:
    """``[(args, given as PRECOMPILE_CACHE)]`` for the form at ``index`` of the table.  Other forms run two
    commands, in turn down the table (every command several times over the table): the open and its errors are
    the same code in every command, but for inspect and explain, which read the URL's keys first."""
    if name in EVERY_COMMAND:
        every = [(c, False) for c in COMMANDS if c != ("verify",) or name == EVERY_COMMAND[0]]
        return every + [(("stats", "--format", "prometheus"), False), (("stats",), True), (("ls",), True)]
    if outcome == "works":
        return [(("ls",), False), (("inspect", "{key}"), True)]
    return [(COMMANDS[index % 5], False), (COMMANDS[(index + 2) % 5], True)]


@pytest.fixture(scope="module")
def table(tmp_path_factory, artifacts):
    """``(stored artifact key, {form name: Form})``: one redis-server for the module, holding the session's
    ``"dynamo"`` artifact (under both prefixes the forms use)."""
    from cache_backends.local.cache import LocalCache
    from cache_backends.redis.cache import RedisCache
    from precompile.ops.bundle import closure

    key = artifacts("dynamo").art.key
    secured = start_secured(tmp_path_factory.mktemp("secured"))
    try:
        local = LocalCache(artifacts.cache_dir, create=False)
        digest, blobs = closure(local, key)
        for prefix in ("precompile", "dflt"):
            with RedisCache(secured.admin(), url="redis://admin", prefix=prefix) as remote:
                for d, bound in blobs.items():
                    remote.put_blob(local.get_blob(d, bound))  # type: ignore[arg-type]
                remote.set_ref(key, digest)
        yield key, {f.name: f for f in forms(secured, tmp_path_factory.mktemp("near"))}
    finally:
        secured.server.stop()


@pytest.mark.parametrize("name", names())
def test_no_command_prints_a_secret(table, name, tmp_path):
    key, by_name = table
    form = by_name[name]
    runs = _runs(names().index(name), name, form.outcome)

    def run(job: tuple[tuple[str, ...], bool]):
        args, from_env = [a.format(key=key) for a in job[0]], job[1]
        env = {"PRECOMPILE_CACHE": form.url} if from_env else {}
        return args, cli(*args, *([] if from_env else ["--cache", form.url]), env=env, check=False,
                         cwd=str(tmp_path))

    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(run, runs))
    for args, proc in done:
        said = proc.stdout + proc.stderr
        if form.outcome == "works":
            assert proc.returncode == 0, f"{args}: {said}"
        else:  # refused, or a tier that does not answer: one line on stderr
            assert proc.returncode in (1, 2) and proc.stderr.startswith("Error: "), f"{args}: {said}"
        for secret in form.secrets:
            assert secret not in said, f"{args}: {secret!r} of {name!r} printed:\n{said}"
        assert "***" in said, f"{args}: the URL was not shown: {said}"
