"""The node daemon's server: start-up (`startup`), the collector process it supervises
(`supervisor`) and that process's main (`child`, with the collector side it assembles in
`assembly`), the HTTP app (`app`, `routes`) and server (`httpserver`), and the web config
(`webconfig`: TLS and basic auth).

Nothing is imported here: the collector process imports `llmmon.serve.child` without the web
stack.
"""
