import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from cvxtransformer.testing import (CASES, GROUP_LASSO_CASES, case_id, cases_of, random_problem,  # noqa: F401
                                   random_targets)

MHSA_CASES, GATED_MHSA_CASES, MIXER_CASES = cases_of("mhsa"), cases_of("gated_mhsa"), cases_of("mixer")

DOCS = Path(__file__).resolve().parents[1] / "docs"
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _quiet_cvxpy_warnings():
    # "Solution may be inaccurate" is reported in the status, not by a warning.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        warnings.filterwarnings("ignore", message="The problem has an expression with dimension greater than 2")
        yield


def gates_through_the_command_line(tmp_path, capsys, program, gate, y_shape):
    """``solve`` (3 gates, seed 5, fista) then ``verify`` (with another --gates: RESULT's gates are used) of a
    gated family from the command line, then ``solve`` from a DATA folder holding 2 of those gates as
    ``<gate>.npy``. Returns (X, y, args, the solve's JSON, the verify's JSON, the RESULT file, the folder's
    JSON), for the family's own assertions."""
    from cvxtransformer.cli import main

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((30, 4, 3)), rng.standard_normal(y_shape)
    data = tmp_path / "d.npz"
    np.savez(data, X=X, y=y)
    out = tmp_path / "r.npz"
    args = ["--program", program, "--loss", "squared", "--beta-frac", "0.3"]
    assert main(["solve", str(data), *args, "--gates", "3", "--gate-seed", "5", "--solver", "fista", "--out", str(out),
                 "--json"]) == 0
    solved = json.loads(capsys.readouterr().out)
    saved = np.load(out)
    assert main(["verify", str(data), str(out), *args, "--gates", "7", "--json"]) == 0
    verified = json.loads(capsys.readouterr().out)
    folder = tmp_path / "data"
    folder.mkdir()
    for name, a in (("X", X), ("y", y), (gate, saved[gate][:2])):
        np.save(folder / f"{name}.npy", a)
    assert main(["solve", str(folder), *args, "--json", "--no-refine"]) in (0, 1)
    from_folder = json.loads(capsys.readouterr().out)
    return X, y, args, solved, verified, saved, from_folder


def load_example(monkeypatch, name):
    """The module of docs/examples/``name`` (a user's own file), loaded, with the families it registers and the
    models they join in compare kept in the calling test (the registry's and compare's tables restored after)."""
    import importlib.util

    from cvxtransformer.comparison import models as compare_models
    from cvxtransformer.core import registry

    monkeypatch.setattr(registry, "_FAMILIES", dict(registry.families()))
    for table in ("MODELS", "DEFAULT_MODELS", "_JOINED"):
        monkeypatch.setattr(compare_models, table, type(getattr(compare_models, table))(getattr(compare_models, table)))
    spec = importlib.util.spec_from_file_location(Path(name).stem, DOCS / "examples" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_doc_examples(name):
    """Run every ```python block of docs/``name`` as written (the docs' examples are tested)."""
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), re.S)
    assert blocks, f"docs/{name} has no python example"
    for code in blocks:
        exec(compile(code, f"docs/{name}", "exec"), {})
