"""The deployment tests' live exporter, for the tests here too."""

from tests.deploy.conftest import certs, web_serve, workdir  # noqa: F401 (fixtures)
