"""What each XID asks of a human, after the resolution buckets of NVIDIA's XID catalogue.

The catalogue (docs.nvidia.com/deploy/xid-errors, "Resolution Bucket (Immediate Action)")
files every code under RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT or IGNORE; here
they are `check_application` (the job's own fault: fix or restart it), `reset_gpu` (drain the
GPU and reset it), `reboot_node`, `rma` (hardware to replace: open a support case) and
`none`.  Codes not listed are `unknown`: look them up.  `PAGED` are the actions that need an
SRE, not the job's owner.
"""

from __future__ import annotations

CHECK_APPLICATION, RESET_GPU, REBOOT_NODE, RMA, NONE = (
    "check_application", "reset_gpu", "reboot_node", "rma", "none")
UNKNOWN = "unknown"
PAGED = (RESET_GPU, REBOOT_NODE, RMA)

ACTIONS: dict[int, str] = {
    8: CHECK_APPLICATION,  # GPU stopped processing (idle timeout)
    13: CHECK_APPLICATION,  # graphics engine exception: an illegal instruction or address
    31: CHECK_APPLICATION,  # GPU memory page fault (out-of-bounds access)
    32: CHECK_APPLICATION,  # invalid or corrupted push buffer stream
    38: RESET_GPU,  # driver firmware error
    43: CHECK_APPLICATION,  # GPU stopped processing: the channel was reset
    45: NONE,  # preemptive cleanup after another error (that one says what to do)
    46: RESET_GPU,  # GPU stopped processing
    48: RESET_GPU,  # double-bit ECC error: reset so the row is remapped
    57: RMA,  # error programming video memory interface
    58: RMA,  # unstable video memory interface detected
    61: RESET_GPU,  # internal micro-controller breakpoint
    62: RESET_GPU,  # internal micro-controller halt
    63: RESET_GPU,  # row remap recorded: a reset (at the job boundary) activates it
    64: RMA,  # row remapper failed to record: memory cannot be repaired
    68: CHECK_APPLICATION,  # video decoder exception
    69: CHECK_APPLICATION,  # graphics engine class error
    74: RESET_GPU,  # NVLink error
    79: REBOOT_NODE,  # GPU has fallen off the bus
    92: NONE,  # high single-bit ECC error rate (corrected)
    94: CHECK_APPLICATION,  # contained ECC error: the process on that memory was killed
    95: RESET_GPU,  # uncontained ECC error: every process on the GPU is affected
    109: CHECK_APPLICATION,  # context switch timeout
    110: RESET_GPU,  # security fault
    119: RESET_GPU,  # GSP RPC timeout
    120: RESET_GPU,  # GSP error
    121: NONE,  # C2C link corrected error
    122: RESET_GPU,  # SPI PMU RPC read failure
    123: RESET_GPU,  # SPI PMU RPC write failure
    124: RESET_GPU,  # SPI PMU RPC erase failure
    137: CHECK_APPLICATION,  # NVLink FLA privilege error
    140: RESET_GPU,  # unrecovered ECC error
    144: RESET_GPU,  # NVLink SAW error
    145: RESET_GPU,  # NVLink RLW error
    146: RESET_GPU,  # NVLink TLW error
    147: RESET_GPU,  # NVLink TREX error
    148: RESET_GPU,  # NVLink NVLPW_CTRL error
    149: RESET_GPU,  # NVLink NETIR error
    150: RESET_GPU,  # NVLink MSE error
    154: NONE,  # GPU recovery action changed (llmmon_gpu_recovery_action says which)
}


def action(xid: int) -> str:
    return ACTIONS.get(xid, UNKNOWN)
