import re
import warnings
from pathlib import Path

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


def run_doc_examples(name):
    """Run every ```python block of docs/``name`` as written (the docs' examples are tested)."""
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(), re.S)
    assert blocks, f"docs/{name} has no python example"
    for code in blocks:
        exec(compile(code, f"docs/{name}", "exec"), {})
