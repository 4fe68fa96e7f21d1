"""The network subsystem: which NIC statistics feed which family, which devices are read."""
