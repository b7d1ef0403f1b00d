"""The papers' experiments on algorithmic data (grokking, kernel preconditioning, spectra).

:mod:`.runner` trains one deep network (:mod:`cvxtransformer.deep`) on one task and records its
curves and spectra; :mod:`.plots` draws them; :mod:`.grok`, :mod:`.suite`, :mod:`.kernel` and
:mod:`.spectra` are the command-line subcommands ``grok``, ``grok-suite``, ``kernel`` and
``spectral`` (see ``docs/reproduction.md``).
"""
from .config import RunConfig

__all__ = ["RunConfig"]
