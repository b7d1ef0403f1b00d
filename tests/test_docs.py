"""The documentation stands alone and agrees with the code: the README's command synopsis is the
parsers' own, no file cites material users do not have (../shared, SPEC.md), and the example pages
run as written."""
import importlib.util
import os
import re
from pathlib import Path

import pytest

from cvxtransformer.cli import synopsis

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".ci", "tests", ".venv", "__pycache__", ".pytest_cache", "_build", "build", "dist", "runs", "out"}
TEXT = {".py", ".md", ".rst", ".txt", ".toml", ".cfg", ".ini", ".yml", ".yaml", ".json", ".sh", ""}


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_synopsis_is_the_parsers():
    readme = (ROOT / "README.md").read_text()
    assert synopsis.rewrite(readme) == readme, "run: python -m cvxtransformer.cli.synopsis README.md"
    block = readme.split(synopsis.BEGIN)[1].split(synopsis.END)[0]
    for command in ("solve", "verify", "demo", "compare", "bert-data", "energy", "kernel"):
        assert f"\ncvxtransformer {command} [-h]" in block, command
    assert "[--beta BETA | --beta-frac F]" in block and "--batch-size" in block and "--eval-every" in block


def test_rewrite_replaces_only_the_marked_block():
    text = f"before\n{synopsis.BEGIN}\nold lines\n{synopsis.END}\nafter\n"
    new = synopsis.rewrite(text)
    assert new.startswith(f"before\n{synopsis.BEGIN}\n```\ncvxtransformer [-h]") and new.endswith(f"{synopsis.END}\nafter\n")
    with pytest.raises(SystemExit, match="no synopsis block"):
        synopsis.rewrite("no markers")


def test_no_file_cites_what_users_do_not_have():
    """Papers are cited by title and arXiv number, the conventions by docs/conventions.md."""
    offenders = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            path = Path(folder) / name
            if path.suffix not in TEXT:
                continue
            text = path.read_text(errors="ignore")
            if "../shared" in text or "SPEC.md" in text or "shared/papers" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_the_example_pages_run_as_written(tmp_path, capsys):
    examples = load("doc_examples")
    for page in examples.PAGES:
        namespace = examples.run_page(ROOT / page, tmp_path)
        printed = capsys.readouterr().out
        assert "certified gap" in printed and "global optimum P(Z*)" in printed
        cert = namespace["cert"]
        assert cert.gap > 0 and cert.lower_bound <= namespace["optimum"] * (1 + 1e-9)
    assert (tmp_path / "certify_your_network.png").read_bytes()[:4] == b"\x89PNG"
    # every figure the page shows is one it writes
    shown = re.findall(r"!\[[^]]*\]\(\.\./figures/examples/([^)]+)\)", (ROOT / examples.PAGES[0]).read_text())
    assert shown and all((tmp_path / name).exists() and (ROOT / "docs/figures/examples" / name).exists()
                         for name in shown)


def test_every_page_is_in_a_toctree():
    """Sphinx -W refuses a page no toctree includes (docs/conf.py excludes _build and figures); the
    same check without building the docs."""
    docs = ROOT / "docs"
    listed = set()
    for page in docs.rglob("*.md"):
        for block in re.findall(r"```\{toctree\}(.*?)```", page.read_text(), flags=re.S):
            folder = page.parent.relative_to(docs)
            listed |= {str(folder / line.strip()) if str(folder) != "." else line.strip()
                       for line in block.splitlines() if line.strip() and not line.strip().startswith(":")}
    pages = {str(p.relative_to(docs).with_suffix("")) for p in docs.rglob("*.md")
             if not {"_build", "figures"} & set(p.parts) and p.name not in ("index.md", "README.md")}
    assert sorted(pages - listed) == []
