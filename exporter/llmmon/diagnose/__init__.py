"""`llmmon diagnose`: the triage decision tree walked over live metrics
(docs/design.md#the-decision-tree).

`Diagnoser(sampler)` keeps the daemon's window and serves /api/v1/diagnose; `evaluate` walks
`TREE` over any `View` (a local window, or a Prometheus server with the shipped rules).
"""

from llmmon.diagnose.service import Diagnoser

__all__ = ["Diagnoser"]
