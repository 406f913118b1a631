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
    assert "pytest" in test_command
    ci = (REPO / ".ci" / "run").read_text()
    assert test_command in ci.splitlines(), ".ci/run does not run the README's test command verbatim"
