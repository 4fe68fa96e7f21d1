"""Grafana dashboards for llmmon, generated as code (see `dashboards.generator`)."""
