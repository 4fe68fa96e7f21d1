"""The deployment tests' live exporter, for the tests here too."""

from tests.deploy.conftest import web_serve  # noqa: F401 (a fixture)
