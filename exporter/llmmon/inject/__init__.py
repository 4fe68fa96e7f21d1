"""Zero-touch injection of the reporter into Kubernetes training pods.

`trainerenv` is the environment a rank needs (shared with `llmmon launch`), `owner` names a
pod's job from its controller's labels, `podpatch` turns an opted-in pod into a JSONPatch,
`admission` reads and answers AdmissionReviews, `server` serves them over TLS and
`reportercopy` is what the init container runs.
"""
