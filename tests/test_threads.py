"""The thread policy (cvxtransformer.core.threads): ``threads`` caps torch's and BLAS's threads for a call and
both are restored after; products under SMALL_WORK multiply-adds run on one thread."""
import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

import cvxtransformer as ct
from cvxtransformer.core.threads import SMALL_WORK, limited


def blas_threads():
    return {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


def test_limited_caps_torch_and_blas_and_restores_them():
    torch_before, blas_before = torch.get_num_threads(), blas_threads()
    with limited(1, 10 * SMALL_WORK):
        assert torch.get_num_threads() == 1
        assert set(blas_threads().values()) == {1}
    assert torch.get_num_threads() == torch_before and blas_threads() == blas_before
    with limited(None, SMALL_WORK / 2):  # a small product: one thread whatever the setting
        assert torch.get_num_threads() == 1
    with limited(None, 10 * SMALL_WORK):  # a large one: torch's setting, BLAS no more than it
        assert torch.get_num_threads() == torch_before
        assert all(n <= torch_before for n in blas_threads().values())
    assert torch.get_num_threads() == torch_before and blas_threads() == blas_before


def test_solve_and_certify_take_threads_and_leave_the_settings_as_they_were(monkeypatch):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 4, 3))
    problem = ct.make_problem(X, X[:, 1, 0] + 0.1 * rng.standard_normal(300), program=8, beta_frac=0.2)
    seen = []
    real = torch.Tensor.__matmul__

    def spy(a, b):  # the threads of every product of the call
        seen.append(torch.get_num_threads())
        return real(a, b)

    torch_before, blas_before = torch.get_num_threads(), blas_threads()
    monkeypatch.setattr(torch.Tensor, "__matmul__", spy)
    result = ct.solve(problem, "fista", threads=1)
    assert result.certified and seen and set(seen) == {1}
    assert ct.certify(problem, result.Z, threads=1).certified
    assert torch.get_num_threads() == torch_before and blas_threads() == blas_before
    with pytest.raises(ct.InvalidInputError, match="threads"):
        ct.solve(problem, "fista", threads=0)
    with pytest.raises(ct.InvalidInputError, match="threads"):
        ct.certify(problem, result.Z, threads=-1)


def limits_entered(monkeypatch):
    """The ``limits`` of every threadpoolctl limit the library's controller enters, as a list that grows."""
    from cvxtransformer.core import threads
    entered, controller = [], threads._blas()
    real = type(controller).limit

    def spy(self, *args, **kwargs):
        entered.append(kwargs.get("limits"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(controller), "limit", spy)
    return entered


def two_blas_threads():
    """threadpoolctl's limit of 2 BLAS threads (whatever the machine's default), and the setting it gives."""
    from threadpoolctl import threadpool_limits
    limit = threadpool_limits(limits=2, user_api="blas")
    if 2 not in blas_threads().values():
        limit.restore_original_limits()
        pytest.skip("no BLAS library here runs 2 threads")
    return limit


def test_a_block_inside_one_that_set_the_same_threads_leaves_blas_alone(monkeypatch):
    """threadpoolctl's limit is entered once for nested blocks of the same number (a solve nests four), again
    where an inner block asks for another number, and the outer setting is back after either."""
    entered = limits_entered(monkeypatch)
    with two_blas_threads():
        blas_before = blas_threads()
        with limited(1):
            with limited(1, 10 * SMALL_WORK):
                with limited(None, SMALL_WORK / 2):  # one thread again
                    assert set(blas_threads().values()) == {1}
            assert entered == [1]
            with limited(2, 10 * SMALL_WORK):
                assert max(blas_threads().values()) <= 2 and torch.get_num_threads() == 2
            assert entered == [1, 2] and set(blas_threads().values()) == {1} and torch.get_num_threads() == 1
        assert blas_threads() == blas_before


def test_a_block_whose_number_blas_already_runs_on_sets_nothing(monkeypatch):
    """Where every BLAS library already runs on the number a block asks for (a caller's own threadpoolctl limit, as
    the benchmarks set), threadpoolctl's limit is not entered, and the setting is the same inside and after; where
    one does not, it is entered and restored."""
    from threadpoolctl import threadpool_limits

    entered = limits_entered(monkeypatch)
    with threadpool_limits(limits=1, user_api="blas"):
        with limited(1):
            assert set(blas_threads().values()) == {1}
        assert entered == [] and set(blas_threads().values()) == {1}
    with two_blas_threads():
        before = blas_threads()  # (a single-threaded build stays at 1)
        with limited(1, 10 * SMALL_WORK):
            assert set(blas_threads().values()) == {1}
        assert entered == [1] and blas_threads() == before
