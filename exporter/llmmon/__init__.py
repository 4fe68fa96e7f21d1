"""llmmon: a Prometheus exporter for the nodes of LLM training clusters."""

__version__ = "0.1.0"
