"""Sphinx configuration: the API reference (autodoc, NumPy-style docstrings through napoleon) and the
Markdown pages of docs/ (myst-parser). Build, with warnings as errors:

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""
import os
import re
import sys

sys.path.insert(0, os.path.abspath(".."))

import cvxtransformer  # noqa: E402

project = "cvxtransformer"
author = "the cvxtransformer developers"
release = version = cvxtransformer.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "figures"]
myst_heading_anchors = 3
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True
napoleon_custom_sections = [("Options", "params_style")]
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_typehints = "none"
html_theme = "alabaster"


def skip_inherited_sklearn(app, what, name, obj, skip, options):
    """scikit-learn's generated ``set_*_request`` methods are theirs, not this package's API."""
    return True if name.startswith("set_") and name.endswith("_request") else None


SECTIONS = {"Parameters", "Attributes", "Options", "Other Parameters"}
ITEM = re.compile(r"^(\s*)([A-Za-z_*][\w*]*(?:, *[A-Za-z_*][\w*]*)*) : (.+)$")


def name_then_text(app, what, name, obj, options, lines):
    """The package's docstrings write ``name : what it is`` (type and description in one phrase); give
    napoleon the phrase as the description, not as a type: ``name`` then the phrase, indented."""
    section, indent, out = None, None, []
    for i, line in enumerate(lines):
        if line.strip() and i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}:
            section, indent = line.strip(), None
        match = ITEM.match(line)
        if section in SECTIONS and match and indent in (None, len(match.group(1))):
            indent = len(match.group(1))
            out += [match.group(1) + match.group(2), match.group(1) + "    " + match.group(3)]
        else:
            out.append(line)
    lines[:] = out


def setup(app):
    app.connect("autodoc-skip-member", skip_inherited_sklearn)
    app.connect("autodoc-process-docstring", name_then_text, priority=100)
html_title = f"cvxtransformer {release}"
