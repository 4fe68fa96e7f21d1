"""The dashboards as data, as the tests in tests/dashboards/ see them."""

from tests.dashboards.conftest import dashboards, panels, targets  # noqa: F401 (fixtures)
