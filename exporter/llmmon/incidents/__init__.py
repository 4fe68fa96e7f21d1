"""Incidents: the evidence of a hang or an abnormal end, kept on the node before the job dies.

Each node's daemon writes one directory per incident (`recorder`, `capture`), serves it
(`store`, `html`), and `llmmon incident` merges the directories of a job's nodes (`fetch`,
`frtrace`, `merge`). The directory format is in `layout`.
"""
