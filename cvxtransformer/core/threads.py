"""The library's thread policy: how many CPU threads its torch and numpy (BLAS) products use.

One rule for the torch backend, the verifier and the recovered heads' objectives:

* ``threads`` (an option of :func:`cvxtransformer.solve`, :func:`cvxtransformer.certify` and the torch
  backend) is the most CPU threads a call uses, for torch
  (``torch.set_num_threads``) and for numpy's BLAS (through threadpoolctl, never by environment
  variables); None keeps torch's setting and gives BLAS the same number, so numpy never runs more
  threads than torch inside a call;
* products of fewer than :data:`SMALL_WORK` multiply-adds run on one thread whatever ``threads``
  says: splitting them costs more than it saves, and on a loaded machine every parallel region waits
  for its slowest thread, which may be descheduled for a whole time slice (numpy's two default BLAS
  threads turned a 0.04 s evaluation of the recovered heads into 1.15 s under a load of 2 on two cores).

Both are restored when the call ends. On a machine shared with other work, ``threads=1`` is the
setting that never waits for a core another process holds (the benchmarks run every solver so).
"""
import contextlib

import torch

SMALL_WORK = 2e6  # multiply-adds per product below which CPU products run on one thread

_controller = None


def _blas():
    """threadpoolctl's controller of the BLAS libraries loaded (made once: scanning them takes a few ms)."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller


def for_work(work, threads=None):
    """The threads a product of ``work`` multiply-adds runs on: one below :data:`SMALL_WORK`, else ``threads``
    (None: torch's setting)."""
    if work is not None and work < SMALL_WORK:
        return 1
    return torch.get_num_threads() if threads is None else int(threads)


def _blas_libraries():
    """threadpoolctl's controllers of the BLAS libraries loaded."""
    return [lib for lib in _blas().lib_controllers if lib.user_api == "blas"]


_blas_limit = None  # the BLAS limit that the innermost limited() block set (None: none is set)


@contextlib.contextmanager
def limited(threads=None, work=None, device=None):
    """Run the block on :func:`for_work` ``(work, threads)`` CPU threads, torch's and BLAS's, restored after.

    ``device``: the torch device of the block's products; on a GPU nothing changes. A block inside another
    that set the same number leaves BLAS as it is (threadpoolctl's limit costs about 15 us a call; a solve
    nests four)."""
    global _blas_limit
    if device is not None and torch.device(device).type != "cpu":
        yield
        return
    want = for_work(work, threads)
    old = torch.get_num_threads()
    if want != old:
        torch.set_num_threads(want)
    outer = _blas_limit
    try:
        if outer == want or all(lib.get_num_threads() == want for lib in _blas_libraries()):
            yield  # BLAS runs on that number already: nothing to set or restore (a query costs about 1 us)
        else:
            with _blas().limit(limits=want, user_api="blas"):
                _blas_limit = want
                yield
    finally:
        _blas_limit = outer
        if want != old:
            torch.set_num_threads(old)
