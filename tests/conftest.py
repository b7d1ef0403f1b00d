import warnings

import pytest
import torch

from cvxtransformer.testing import (CASES, GATED_MHSA_CASES, GROUP_LASSO_CASES, MHSA_CASES, NUCLEAR_CASES,  # noqa: F401
                                   case_id, random_problem, random_targets)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def _quiet_cvxpy_warnings():
    # "Solution may be inaccurate" is reported in the status, not by a warning.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        yield
