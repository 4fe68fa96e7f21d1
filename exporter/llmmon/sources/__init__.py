"""Sources: the only code that touches files, NVML, netlink or the spool directory."""
