"""A family in a user's installed package reaches everything, the command line included: an entry point of
``cvxtransformer.families`` (a throwaway distribution in a temporary folder, on PYTHONPATH of a fresh
interpreter: docs/examples/bilinear_family.py as its module) is listed in ``--program``'s help, solved and
verified from the command line, taken by ``make_problem`` and the estimators; ``compare`` on it (no models)
is one line; a failing entry point is one line naming it and breaks no other family."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from cvxtransformer.cli.options import PROGRAMS

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import contextlib, io, json, sys
    import numpy as np
    from cvxtransformer.cli import main

    def run(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
        return {"code": code, "out": out.getvalue(), "err": err.getvalue()}

    data, result = sys.argv[1], sys.argv[2]
    args = ["--program", "bilinear", "--loss", "squared", "--beta-frac", "0.2"]
    report = {"help": run("solve", "--help"),
              "solve": run("solve", data, *args, "--solver", "fista", "--out", result, "--json"),
              "verify": run("verify", data, result, *args, "--json"),
              "compare": run("compare", data, *args, "--steps", "5", "--out-dir", result + ".d"),
              "builtin": run("solve", data, "--program", "10", "--loss", "squared", "--beta-frac", "0.2", "--json")}
    import cvxtransformer as ct
    from cvxtransformer.estimators import ConvexRegressor
    X, y = np.load(data)["X"], np.load(data)["y"]
    report["estimator"] = float(ConvexRegressor(program="bilinear", beta_frac=0.2).fit(X, y).score(X, y))
    report["api"] = ct.solve(ct.make_problem(X, y, program="bilinear", beta_frac=0.2), "clarabel",
                             tol=1e-8).certificate.primal_objective
    print(json.dumps(report))
""")


def distribution(folder, name, module_source, entry):
    """A distribution installed in ``folder``: ``<name>.py`` and ``<name>-0.1.dist-info`` with METADATA and an
    entry point ``entry`` (``"family = module:callable"``) of cvxtransformer.families."""
    folder.mkdir(parents=True, exist_ok=True)
    if module_source is not None:
        (folder / f"{name}.py").write_text(module_source)
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[cvxtransformer.families]\n{entry}\n")


def run_script(tmp_path, path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 4, 3))
    y = np.einsum("ikd,lkd->il", X, rng.standard_normal((2, 4, 3))) + 0.1 * rng.standard_normal((40, 2))
    np.savez(tmp_path / "d.npz", X=X, y=y)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [*map(str, path), str(ROOT),
                                                                   os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "d.npz"), str(tmp_path / "r.npz")],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


@pytest.mark.slow
def test_an_installed_packages_family_reaches_the_command_line_and_a_broken_one_is_one_line(tmp_path):
    good, bad = tmp_path / "site", tmp_path / "broken"
    distribution(good, "bilinear_readout", (ROOT / "docs" / "examples" / "bilinear_family.py").read_text(),
                 "bilinear = bilinear_readout:register_family")
    distribution(bad, "broken_family", None, "broken = no_such_module:register")
    report, stderr = run_script(tmp_path, [good, bad])

    help_text = report["help"]["out"]
    assert report["help"]["code"] == 0 and f"--program {{{','.join(PROGRAMS + ('bilinear', 'broken'))}}}" in help_text
    assert "bilinear: a family of the installed package bilinear_readout (bilinear_readout:register_family)" in \
        " ".join(help_text.split())
    solved, verified = (json.loads(report[k]["out"]) for k in ("solve", "verify"))
    assert report["solve"]["code"] == 0 and solved["certified"] and solved["program"] == "bilinear"
    assert report["verify"]["code"] == 0 and verified["certified"]
    assert solved["primal_objective"] == pytest.approx(report["api"], rel=1e-6)
    assert verified["data_fingerprint"].startswith("checked")
    assert report["estimator"] > 0.5
    compared = report["compare"]
    assert compared["code"] == 2 and compared["err"].count("\n") == 1 and compared["err"].startswith(
        "cvxtransformer compare: error: models: expected a model of compare for bilinear readout program, got none")
    assert report["builtin"]["code"] == 0 and json.loads(report["builtin"]["out"])["certified"]
    # the broken entry point: one line, said once, naming it; every other family works
    said = stderr + "".join(run["err"] for run in report.values() if isinstance(run, dict))
    lines = [line for line in said.splitlines() if "no_such_module" in line]
    assert lines == ["cvxtransformer: the entry point 'broken = no_such_module:register' (cvxtransformer.families) "
                     "failed: ModuleNotFoundError: No module named 'no_such_module'; its families are not registered"]
    assert "Traceback" not in stderr


def test_the_registry_calls_entry_points_once_and_keeps_going_after_a_failure(monkeypatch, capsys):
    from cvxtransformer.core import registry

    calls = []

    class Point:
        def __init__(self, name, value, target):
            self.name, self.value, self.target = name, value, target

        def load(self):
            return self.target

    def boom():
        calls.append("boom")
        raise RuntimeError("bad\nsecond line")

    monkeypatch.setattr(registry, "_FAMILIES", dict(registry.families()))
    monkeypatch.setattr(registry, "_ENTRY_POINTS_CALLED", [])
    monkeypatch.setattr(registry, "ENTRY_POINT_ERRORS", {})
    monkeypatch.setattr(registry, "entry_points", lambda: [Point("x", "m:boom", boom),
                                                           Point("y", "m:ok", lambda: calls.append("ok"))])
    families = registry.families()
    registry.families()
    assert calls == ["boom", "ok"] and "mixer" in families  # once each; the built-in families are there
    assert capsys.readouterr().err == ("cvxtransformer: the entry point 'x = m:boom' (cvxtransformer.families) failed: "
                                       "RuntimeError: bad; its families are not registered\n")
    with pytest.raises(Exception, match=r"^program: expected one of .*, got 'x'; the entry point 'x = m:boom'"):
        registry.family("x")


def test_no_entry_point_costs_no_lookup_on_a_run():
    """The command line reads the entry points when its help is shown or a name that is no built-in one
    is given; parsing a built-in name does not (the start-up time of docs/benchmark_startup.md)."""
    code = ("import sys\nfrom cvxtransformer.cli import build_parser\n"
            "build_parser('solve').parse_args(['solve', 'd.npz', '--program', 'mixer', '--loss', 'squared', "
            "'--beta', '1'])\nprint('importlib.metadata' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]
    assert shutil.which("cvxtransformer") or True  # (the console script is not needed here)
