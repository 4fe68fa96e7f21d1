"""Incidents: the evidence of a hang or an abnormal end, kept on the node before the job dies.

Each node's daemon writes one directory per incident (`recorder`, from what `capture` gathers),
serves it from disk (`store`; pages: `html`, `incidentpage`, `changes`, and the node's live
`status` page), and `llmmon incident` merges the directories of a job's nodes (`fetch`,
`frtrace` for the Flight Recorder dumps read together, `outliers` for the counters, `merge`).
The directory format is in `layout`.
"""
