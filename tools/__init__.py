"""Developer tools run from a checkout (`python -m tools.<name>`); not part of the package."""
