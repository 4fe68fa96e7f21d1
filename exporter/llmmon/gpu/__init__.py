"""Helpers of the GPU collector: fast power sampling, XID events, pod attribution, peak FLOPs."""
