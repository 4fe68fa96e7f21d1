"""`llmmon simulate`: simulated training nodes that feed the unmodified exporter.

Each node is a directory of the inputs a real node gives the exporter: a sysfs tree (PCIe
topology, /sys/class/infiniband, /sys/class/net), a procfs tree (diskstats, pressure/io,
process cgroups), NVML replay files (one per GPU), `ethtool -S` dumps, an `ip -s -s -j link`
dump and the rank spool the in-process reporter writes.  A tick loop rewrites them from a
model of the hardware and the training job, and scenarios (data-loader starvation, a hung rank,
a thermal card, a PFC storm, ...) bend that model while it runs.  `llmmon serve` reads the
trees exactly as it reads /sys and /proc, so what the dashboards and alerts see is what a
real node with that fault would show.  docs/simulate.md describes the scenarios.
"""
