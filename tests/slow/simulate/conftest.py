"""The simulator tests' scratch directory, for the tests here too."""

from tests.simulate.conftest import work  # noqa: F401 (a fixture)
