"""The ranks subsystem: spool documents validated, remembered, turned into hang evidence and dumps."""
