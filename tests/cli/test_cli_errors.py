"""A wrong cache URL, an unreachable cache or a bad environment value is an error, never a silent downgrade:
each bad input below is one line on stderr that names the problem, a non-zero exit status (2 for a mistake in
what was asked, 1 for a cache that cannot be used), and no directory created."""

from __future__ import annotations

import logging

import pytest
from _cli import cli, error_line
from _redis import free_port


@pytest.fixture
def dead_redis() -> str:
    return f"redis://127.0.0.1:{free_port()}/0?timeout=1"


@pytest.mark.parametrize("args, env, code, says", [
    (["ls", "--cache", "garbage"], {}, 2, "'garbage' is not a cache URL"),
    (["stats", "--cache", "not a url at all"], {}, 2, "is not a cache URL"),
    (["ls"], {"PRECOMPILE_CACHE": "not a url at all"}, 2, "PRECOMPILE_CACHE: 'not a url at all' is not a cache URL"),
    (["stats", "--cache", "ftp://x"], {}, 2, "no cache backend handles ftp:// URLs"),
    (["inspect", "abcdef", "--cache", "file://{tmp}/c?max_bytes=lots"], {}, 2, "max_bytes= must be a positive"),
    (["ls", "--cache", "redis://127.0.0.1:6379/0?colour=blue"], {}, 2, "unknown option 'colour'"),
    # numbers that overflowed (OverflowError tracebacks), and TLS options handed to a plain connection (TypeError)
    (["ls", "--cache", "redis://127.0.0.1:6379/0?chunk_size=1e999"], {}, 2, "chunk_size= must be a size in bytes "
                                                                             "from 1 to 536870912 (512 MiB)"),
    (["ls", "--cache", "redis://127.0.0.1:6379/0?ttl=1e306"], {}, 2, "ttl= must be a number of seconds > 0 and at "
                                                                     "most 315360000 (10 years)"),
    (["stats", "--cache", "redis://127.0.0.1:6379/0?timeout=1e306"], {}, 2, "timeout= must be a number of seconds"),
    (["stats", "--cache", "redis://127.0.0.1:6379/0?ssl_cert_reqs=none"], {}, 2, "needs a rediss:// URL"),
    (["ls", "--cache", "file://{tmp}/local?grace_s=inf"], {}, 2, "grace_s= must be a number of seconds >= 0"),
    (["ls", "--cache", "file://{tmp}/nonexistent/deep/dir"], {}, 1, "no cache at file://"),
    (["stats", "--cache", "{tmp}/nonexistent"], {}, 1, "does not exist"),
    (["verify", "--cache", "file://{tmp}/gone"], {}, 1, "no cache at"),
    (["gc", "--older-than", "1d", "--cache", "file://{tmp}/gone"], {}, 1, "no cache at"),
    (["export", "abcdef", "-o", "{tmp}/b.pcb", "--cache", "file://{tmp}/gone"], {}, 1, "no cache at"),
    (["rebuild", "--cache", "file://{tmp}/gone"], {}, 1, "no cache at"),
    (["diff", "abcdef", "--cache", "file://{tmp}/gone"], {}, 1, "no cache at"),
    (["ls", "--cache", "{dead}"], {}, 1, "Connection refused"),
    (["stats", "--cache", "{dead}"], {}, 1, "Connection refused"),
    (["stats", "--format", "prometheus", "--cache", "{dead}"], {}, 1, "Connection refused"),
    (["inspect", "abcdef", "--cache", "{dead}"], {}, 1, "Connection refused"),
    (["verify", "--cache", "file://{tmp}/local|{dead}"], {}, 1, "Connection refused"),
    (["ls", "--cache", "file://{tmp}/local"], {"PRECOMPILE_LOG": "LOUD"}, 2, "PRECOMPILE_LOG must be one of"),
    (["gc", "--cache", "file://{tmp}/local"], {}, 2, "gc needs --max-bytes SIZE or --older-than AGE"),
    (["gc", "--max-bytes", "lots", "--cache", "file://{tmp}/local"], {}, 2, "a size is a number of bytes"),
    (["rebuild", "--max-bytes", "lots", "--cache", "file://{tmp}/local"], {}, 2, "a size is a number of bytes"),
    (["rebuild", "--max-bytes", "9" * 400, "--cache", "file://{tmp}/local"], {}, 2, "--max-bytes"),
    (["rebuild", "--cache", "file://{tmp}/local"], {"PRECOMPILE_REBUILD_MAX_BYTES": "-1"}, 2,
     "PRECOMPILE_REBUILD_MAX_BYTES must be a positive integer"),
    (["rebuild", "--cache", "file://{tmp}/local"], {"PRECOMPILE_REBUILD_MAX_FLOPS": "1e13"}, 2,
     "PRECOMPILE_REBUILD_MAX_FLOPS must be a positive integer"),
    (["import", "{tmp}/missing.pcb", "--cache", "file://{tmp}/new"], {}, 1, "missing.pcb"),
])
def test_bad_input_is_one_line_and_creates_nothing(tmp_path, dead_redis, args, env, code, says):
    (tmp_path / "local").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [a.format(tmp=tmp_path, dead=dead_redis) for a in args]
    proc = cli(*args, env=env, check=False, cwd=str(tmp_path))
    assert proc.returncode == code, proc.stderr
    assert says in error_line(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created, not even in the cwd
    assert proc.stdout == ""


def test_python_dash_m_precompile_and_help():
    out = cli("--help").stdout
    for command in ("warmup", "ls", "inspect", "stats", "diff", "explain", "verify", "gc", "export", "import",
                    "rebuild"):
        assert command in out


def test_api_raises_on_a_bad_cache_url(tmp_path, monkeypatch):
    import torch

    import precompile
    from precompile.errors import CacheURLError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(CacheURLError, match="ftp://"):
        precompile.backend(cache="ftp://x")
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    for url, says in (("ftp://x", "no cache backend handles ftp://"), ("not a url at all", "not a cache URL"),
                      ("file:///tmp/x?max_bytes=lots", "max_bytes")):
        with pytest.raises(CacheURLError, match=says):  # raised before anything is compiled
            precompile.standalone_compile(gm, [torch.ones(2)], cache=url)
    monkeypatch.setenv("PRECOMPILE_CACHE", "not a url at all")
    with pytest.raises(CacheURLError, match="PRECOMPILE_CACHE: 'not a url at all'"):
        precompile.open_cache()
    with pytest.raises(CacheURLError, match="PRECOMPILE_CACHE"):
        precompile.backend()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, value, call", [
    ("PRECOMPILE_LOG", "LOUD", "log_level"),
    ("PRECOMPILE_ENGINE", "turbo", "engine_mode"),
    ("PRECOMPILE_CACHE_MAX_BYTES", "lots", "local_max_bytes"),
    ("PRECOMPILE_EXPLAIN", "maybe", "explain_misses"),
    ("PRECOMPILE_VLLM_PLATFORM", "maybe", "vllm_platform_enabled"),
])
def test_bad_environment_values_name_the_variable(monkeypatch, name, value, call):
    from precompile import config
    from precompile.errors import ConfigError

    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name} .*{value}"):
        getattr(config, call)()
    with pytest.raises(ValueError):  # a ConfigError is a ValueError too
        getattr(config, call)()


def test_vllm_platform_switch(monkeypatch, caplog):
    """The accepted values of PRECOMPILE_VLLM_PLATFORM; another keeps the plugin out, with a warning naming it
    (vLLM itself would swallow the error at debug level)."""
    from precompile import config
    from precompile.integrations.vllm.platform import platform_plugin

    for value, enabled in (("", True), ("1", True), ("On", True), ("yes", True), ("0", False), ("off", False)):
        monkeypatch.setenv("PRECOMPILE_VLLM_PLATFORM", value)
        assert config.vllm_platform_enabled() is enabled, value
    monkeypatch.setenv("PRECOMPILE_VLLM_PLATFORM", "disabled")
    with caplog.at_level(logging.WARNING, logger="precompile"):
        assert platform_plugin() is None
    assert "PRECOMPILE_VLLM_PLATFORM must be 1 or 0 (true/false, yes/no, on/off), got 'disabled'" in caplog.text
