"""The README's 30-second example runs as written (in a fresh process, against a temporary cache)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO, run_python


def test_readme_python_example_runs(tmp_path):
    text = (REPO / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    cache = tmp_path / "pc"
    code = block.replace("file:///tmp/pc", f"file://{cache}").replace('"mlp.pc"', repr(str(tmp_path / "mlp.pc")))
    code += (
        "\nimport torch\n"
        "assert torch.allclose(again(x), model(x), atol=1e-6)\n"
        "assert torch.allclose(art(x), model(x), atol=1e-6)\n"
        "assert len(art.key) == 64\n"
        "print('ok', again.engine_kind)\n"
    )
    out = run_python(code, timeout=600)
    assert out.strip().splitlines()[-1] == "ok fast"
    assert any(Path(cache, "ref").iterdir())


def test_ci_runs_the_readme_test_command():
    text = (REPO / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", text, re.S)
    assert len(commands) == 2, "the README has exactly two set-up commands"
    test_command = commands[1]
    ci = (REPO / ".ci" / "run").read_text()
    assert test_command in ci.splitlines(), ".ci/run does not run the README's test command verbatim"
    script = test_command.split()[-1]
    assert test_command == f"bash {script}" and (REPO / script).is_file()
    steps = (REPO / script).read_text()
    assert "-m pytest" in steps


def test_the_test_script_names_the_step_that_fails(tmp_path):
    """tools/test.sh, with a step made to fail (python3 that cannot make a venv): it says which step failed."""
    import os
    import shutil
    import subprocess

    root = tmp_path / "repo"
    (root / "tools").mkdir(parents=True)
    shutil.copy(REPO / "tools" / "test.sh", root / "tools" / "test.sh")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for tool in ("redis-server", "promtool"):  # step 1 finds them: nothing is installed
        (fake_bin / tool).write_text("#!/bin/sh\nexit 0\n")
        (fake_bin / tool).chmod(0o755)
    (fake_bin / "python3").write_text("#!/bin/sh\necho 'no venv here' >&2\nexit 3\n")
    (fake_bin / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(root / "tools" / "test.sh")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 3
    assert "==> [1/8] done" in proc.stderr and "==> [2/8] venv .venv" in proc.stderr
    assert "==> FAILED at step 2/8: venv .venv" in proc.stderr and "[3/8]" not in proc.stderr
