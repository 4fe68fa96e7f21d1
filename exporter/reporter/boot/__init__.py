"""Start-up hook directory that `llmmon launch` puts on PYTHONPATH (see sitecustomize.py)."""
