"""The README's Python snippets run as written, and its commands exist."""
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_python_snippets_run(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    names = {}
    for code in blocks:
        exec(compile(code, str(README), "exec"), names)
    out = capsys.readouterr().out
    assert "True" in out  # the snippet prints the certificate's verdict
    # issue 36: the two certificates of a given Z print their verdict, and the comments say the right one
    own, off = names["own"], names["off"]
    assert own.certified and own.relative_gap <= own.tol < off.relative_gap and not off.certified
    assert f"{own.relative_gap} True\n" in out and f"{off.relative_gap} False\n" in out
    assert names["problem"].beta == 0.2 * names["problem"].beta_max()


def test_documented_commands_exist():
    text = README.read_text()
    code = "\n".join(re.findall(r"```(?:bash)?\n(.*?)```", text, re.S))
    commands = set(re.findall(r"^cvxtransformer ([a-z-]+)", code, re.M)) - {"grok"}
    listing = subprocess.run([sys.executable, "-m", "cvxtransformer", "--help"], capture_output=True, text=True).stdout
    for name in commands | {"grok", "grok-suite", "kernel", "spectral", "energy"}:
        assert re.search(rf"^\s+{re.escape(name)}\s", listing, re.M), name
    for doc in re.findall(r"\]\((docs/[^)]+)\)", text):
        assert (README.parent / doc).exists(), doc
