"""The certified convex optimum against networks trained by SGD or Adam: :func:`compare`.

* :mod:`.models`: the table of models (network, bounding program, default heads); a new model is a row;
* :mod:`.run`: :func:`compare` (and :func:`plan`, its validation alone);
* :mod:`.tuning`: the learning rate and beta chosen on a validation split;
* :mod:`.result`: :class:`Comparison` and :class:`ModelResult`, with ``to_dict``, ``plot`` and ``save``;
* :mod:`.plots`: the PNG plots.

The command ``cvxtransformer compare`` is a thin layer over :func:`compare`.
"""
from .models import MODELS
from .run import Plan, compare, plan
from .result import Comparison, ModelResult

__all__ = ["MODELS", "Comparison", "ModelResult", "Plan", "compare", "plan"]
