"""The torch proximal-gradient backend (``solver="fista"``); see :mod:`.driver`."""
from .driver import ProxGrad

__all__ = ["ProxGrad"]
