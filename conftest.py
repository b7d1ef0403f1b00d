"""Collection of the package's docstring examples (``--doctest-modules``, pyproject.toml): a module
that needs an optional package that is not installed is not collected, and the header says so; the
tests of that feature skip with the reason (``pytest.importorskip``). So the README's test command
passes after the README's set-up, whatever optional packages are or are not installed."""
import importlib.util

OPTIONAL_MODULES = {"cvxtransformer/estimators.py": ("sklearn", "scikit-learn")}  # module -> (import, package)

MISSING = {path: package for path, (module, package) in OPTIONAL_MODULES.items()
           if importlib.util.find_spec(module) is None}
collect_ignore = sorted(MISSING)


def pytest_report_header(config):
    if MISSING:
        return "optional packages not installed (their doctests are not collected, their tests skip): " + \
            ", ".join(f"{package} ({path})" for path, package in sorted(MISSING.items()))
    return None
