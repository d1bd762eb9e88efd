"""The package version, in one place: scikit-build-core reads it into the wheel's metadata (the regex
provider in pyproject.toml), ``sparkgrad.__version__`` and ``sparkgrad --version`` import it."""

__version__ = "0.1.0"
