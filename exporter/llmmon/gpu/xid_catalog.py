"""What each XID asks of a human: the immediate action of NVIDIA's XID catalogue.

The catalogue (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, column
"Resolution Bucket (Immediate Action)") files each code under RESTART_APP, RESET_GPU,
RESTART_BM, CONTACT_SUPPORT, IGNORE or a workflow; here they are `check_application` (the
job's own fault: fix or restart it), `reset_gpu` (drain the GPU and reset it), `reboot_node`,
`rma` (contact support: hardware to replace) and `none`.  Workflow buckets take the action
the workflow ends in for the code seen alone (48: reset; 74 and 144-150: reset for the fatal
statuses; 45: the other XID's).  Codes not listed, and buckets with no action here
(CHECK_MECHANICALS, UPDATE_SWFW, RESTART_VM), are `unknown`: look them up.  `PAGED` are the
actions that need an SRE, not the job's owner.  tests/fixtures/gpu/xid_catalog.csv holds the
catalogue rows this table was checked against.
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
    38: NONE,  # driver firmware (watchdog) error; contact support if it recurs
    43: NONE,  # the application hit a fault and was stopped; the GPU stays healthy
    45: NONE,  # preemptive cleanup after another error (that one says what to do)
    46: RESET_GPU,  # GPU stopped processing
    48: RESET_GPU,  # double-bit ECC error (workflow: reset when seen alone)
    57: RMA,  # error programming video memory interface (unused on A100 and later)
    58: RMA,  # unstable video memory interface (unused on A100 and later)
    61: RMA,  # internal micro-controller breakpoint (unused on A100 and later)
    62: RESET_GPU,  # internal micro-controller halt
    63: NONE,  # row remap recorded (a pending remap is GPUEccUncorrectable's, from NVML)
    64: RESET_GPU,  # row remap failed to record (then contact support: GPURowRemapFailure)
    68: CHECK_APPLICATION,  # video decoder exception
    69: CHECK_APPLICATION,  # graphics engine class error
    74: RESET_GPU,  # NVLink error (workflow: a reset or reboot clears it)
    79: REBOOT_NODE,  # GPU has fallen off the bus
    92: NONE,  # high single-bit ECC error rate (corrected)
    94: CHECK_APPLICATION,  # contained ECC error: the process on that memory was killed
    95: RESET_GPU,  # uncontained ECC error: every process on the GPU is affected
    109: RESET_GPU,  # context switch timeout
    110: RESET_GPU,  # security fault
    119: RESET_GPU,  # GSP RPC timeout
    120: RESET_GPU,  # GSP error
    121: NONE,  # C2C link corrected error
    122: RMA,  # SPI PMU RPC read failure (unused on A100 and later)
    123: RMA,  # SPI PMU RPC write failure (unused on A100 and later)
    124: RMA,  # SPI PMU RPC erase failure (unused on A100 and later)
    136: RESET_GPU,  # link (ALI) training failed
    137: NONE,  # NVLink privilege error
    140: RESET_GPU,  # unrecovered ECC error
    143: RESET_GPU,  # GPU initialisation error
    144: RESET_GPU,  # NVLink SAW error (workflow: reset for fatal statuses)
    145: RESET_GPU,  # NVLink RLW error
    146: RESET_GPU,  # NVLink TLW error
    147: RESET_GPU,  # NVLink TREX error
    148: RESET_GPU,  # NVLink NVLPW_CTRL error
    149: RESET_GPU,  # NVLink NETIR error
    150: RESET_GPU,  # NVLink MSE error
    154: NONE,  # GPU recovery action changed (llmmon_gpu_recovery_action says which)
    156: RESET_GPU,  # resource retirement event
    158: RESET_GPU,  # GPU fatal timeout
}


def action(xid: int) -> str:
    return ACTIONS.get(xid, UNKNOWN)
