"""Training ranks: PyTorch allocator, NCCL progress and timings, step metrics, hang evidence.

Reads the spool the in-process reporter writes (reporter/llmmon_reporter), keeps counters across
reads in a ledger, serves the hang evidence at /api/v1/ranks and, once a group has made no
progress for `dump_after`, asks its ranks for a Flight Recorder dump through the dump pipe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any, Iterable

from prometheus_client.core import Metric

from llmmon.ranks import dimension, dumps, stall
from llmmon.collector import Collector, Context, RouteError
from llmmon.metrics import Families, MetricSpec
from llmmon.options import Option
from llmmon.ranks.clock import DaemonClock
from llmmon.ranks.ingest import SpoolIngest
from llmmon.ranks.ledger import DURATION_BUCKETS, Ledger, RankTrack
from llmmon.ranks.liveness import PidWatch, seen_alive
from llmmon.ranks.netns import Member, TcpWatch
from llmmon.ranks.discover import SEEN_FROM_OUTSIDE
from llmmon.ranks.outside import OutsideRanks
from llmmon.ranks.stacks import StackVerdict, collective
from llmmon.ranks.stacksampler import StackSampler
from llmmon.sources import pyspy
from llmmon_reporter.layout import DEFAULT_FR_DIR, DEFAULT_PIPE_DIR, DEFAULT_SPOOL
from llmmon.sources.spool import SpoolSource

log = logging.getLogger("llmmon.ranks")
RANK = ("job_id", "rank")
PG = RANK + ("pg",)
COLL = PG + ("coll",)


def _rank(name: str, kind: str, help_text: str) -> MetricSpec:
    return MetricSpec(name, kind, help_text, RANK)


def _pg(name: str, help_text: str) -> MetricSpec:
    return MetricSpec(name, "gauge", help_text, PG)


RANK_INFO = MetricSpec(
    "llmmon_rank_info", "info",
    "A training rank followed on this node; join on job_id and rank. source: reporter (its "
    "spool file; pid as the rank sees it) or procfs (found without the reporter; pid as the "
    "daemon sees it, which joins llmmon_gpu_process_info).",
    ("job_id", "rank", "local_rank", "world_size", "uuid", "pod", "namespace", "pid", "source"))
RANK_UP = _rank("llmmon_rank_up", "gauge",
                "1 while the rank's reporter writes its file; 0 once stale (then dropped).")
REPORT_AGE = _rank("llmmon_rank_report_age_seconds", "gauge",
                   "Seconds since the rank's reporter last wrote its file.")
REPORTER_DISABLED = _rank("llmmon_reporter_disabled", "gauge",
                          "1 when the reporter disabled itself after repeated failures.")
REPORTER_ERRORS = _rank("llmmon_reporter_errors_total", "counter",
                        "Failures the in-process reporter caught (and survived).")
ALLOCATOR_INFO = MetricSpec(
    "llmmon_torch_allocator_config_info", "info",
    "PYTORCH_CUDA_ALLOC_CONF of the rank (e.g. expandable_segments:True).",
    RANK + ("config",))
MEMORY = (
    (_rank("llmmon_torch_memory_reserved_bytes", "gauge",
           "Bytes the caching allocator holds from CUDA (reserved_bytes.all.current)."),
     "reserved_bytes.all.current"),
    (_rank("llmmon_torch_memory_allocated_bytes", "gauge",
           "Bytes in tensors (allocated_bytes.all.current)."), "allocated_bytes.all.current"),
    (_rank("llmmon_torch_memory_active_bytes", "gauge",
           "Bytes in active blocks (active_bytes.all.current); reserved far above active is "
           "fragmentation."), "active_bytes.all.current"),
    (_rank("llmmon_torch_memory_inactive_split_bytes", "gauge",
           "Bytes in inactive, split blocks (inactive_split_bytes.all.current): fragmentation."),
     "inactive_split_bytes.all.current"),
    (_rank("llmmon_torch_alloc_retries_total", "counter",
           "cudaMalloc failures that flushed the cache and retried: the step before an OOM."),
     "num_alloc_retries"),
    (_rank("llmmon_torch_ooms_total", "counter", "Out-of-memory errors the allocator raised."),
     "num_ooms"),
)
ENQUEUED = _pg("llmmon_nccl_last_enqueued_seq",
               "Sequence number of the last collective the rank enqueued in the group.")
STARTED = _pg("llmmon_nccl_last_started_seq",
              "Last collective seen started (-1 unless TORCH_NCCL_ENABLE_TIMING=1).")
COMPLETED = _pg("llmmon_nccl_last_completed_seq", "Last collective seen completed.")
PROGRESS = _pg("llmmon_nccl_last_progress_timestamp_seconds",
               "Unix time the daemon saw last_completed change (first sight counts).")
INFLIGHT = _pg("llmmon_nccl_oldest_inflight_age_seconds",
               "Seconds since the oldest collective not yet completed was enqueued (0: none).")
LAG = _pg("llmmon_nccl_enqueue_lag_seconds",
          "Enqueue time of the newest sequence every local member enqueued, minus the node "
          "median for it: a rank late to its collectives stands out positive.")
MARK = MetricSpec(
    "llmmon_nccl_mark_enqueue_timestamp_seconds", "gauge",
    "Unix time the rank enqueued its newest collective whose sequence number (the label) is a "
    "multiple of 256, 4096 or 65536 (the largest step that comes every 2 minutes at the group's "
    "pace): the rules compare a job's ranks across nodes at the same collective (a straggler "
    "enqueues it late).", ("job_id", "rank", "pg", "seq"))
DURATION = MetricSpec(
    "llmmon_nccl_collective_duration_seconds", "histogram",
    "Collective durations from the Flight Recorder (TORCH_NCCL_ENABLE_TIMING=1 only), each "
    "record counted once.", COLL)
BYTES = MetricSpec(
    "llmmon_nccl_collective_bytes_total", "counter",
    "Message bytes of finished collectives (nccl-tests' S: input, or total output for "
    "gathers), by the Flight Recorder's dtype name.", COLL + ("dtype",))
BUS_BYTES = MetricSpec(
    "llmmon_nccl_bus_bytes_total", "counter",
    "Bytes x nccl-tests' bus factor, for collectives with a duration: busbw = "
    "rate(this) / rate(duration_seconds_sum).", COLL)
MISSED = _rank("llmmon_nccl_entries_missed_total", "counter",
               "Flight Recorder records the daemon never read: they left the ring between two "
               "reads, or the reporter left them out (a tick ships at most the 500 newest).")
PG_INFO = MetricSpec("llmmon_nccl_pg_info", "info",
                     "A process group of a job; `dimension` is the mesh dimension it carries "
                     "(tp, dp_shard, pp, ep, ... from torch's mesh_<dim> description; world for "
                     "the default group).",
                     ("job_id", "pg", "pg_desc", "size", "ranks", "dimension"))
DUMPS_REQUESTED = MetricSpec(
    "llmmon_nccl_dumps_requested_total", "counter",
    "Flight Recorder dumps the daemon requested: a group stopped progressing, or a "
    "POST /api/v1/ranks/dump asked for one.",
    ("job_id",))
DUMPS_KEPT = MetricSpec("llmmon_nccl_dumps_kept", "gauge",
                        "Flight Recorder dump sets kept for post-mortems.")
STEPS = _rank("llmmon_training_steps_total", "counter", "reporter.step() calls.")
STEP_SECONDS = _rank("llmmon_training_step_seconds", "histogram",
                     "Time between consecutive reporter.step() calls.")
TOKENS = _rank("llmmon_training_tokens_total", "counter", "Tokens passed to reporter.step().")
FLOPS = _rank("llmmon_training_model_flops_total", "counter",
              "Model FLOPs passed to reporter.step(); rate / peak FLOPs is MFU.")
NONFINITE = _rank("llmmon_training_loss_nonfinite_total", "counter",
                  "Steps whose loss was NaN or infinite.")
REJECTED = MetricSpec(
    "llmmon_ranks_spool_rejected_total", "counter",
    "Spool files or entries refused (invalid_json, schema, too_large, symlink, duplicate, "
    "identity_mismatch, ...), once per file version.", ("reason",))
ALIVE = _rank("llmmon_rank_alive", "gauge",
               "0 once the rank's process ended (its reporter's exit record, or its pid gone "
               "from procfs); 1 otherwise. A job with an ended rank is not hung.")
EXIT_CODE = _rank("llmmon_rank_exit_code", "gauge",
                  "Exit status of an ended rank when known (minus the signal for a kill).")
CPU_SECONDS = _rank("llmmon_rank_cpu_seconds_total", "counter",
                    "CPU time of the rank's training (main) thread, from its reporter.")
READ_BYTES = _rank("llmmon_rank_read_bytes_total", "counter",
                   "Bytes the rank's process read (/proc/self/io rchar: files and sockets).")
WRITTEN_BYTES = _rank("llmmon_rank_written_bytes_total", "counter",
                      "Bytes the rank's process wrote (/proc/self/io wchar), less the "
                      "reporter's own files.")
SWITCHES = MetricSpec("llmmon_rank_context_switches_total", "counter",
                      "Context switches of the rank's main thread, by kind (voluntary: it "
                      "blocked; involuntary: it was preempted).", RANK + ("kind",))
CPU_IDLE = _rank("llmmon_rank_cpu_idle_seconds", "gauge",
                 "Seconds since the rank's training thread last used CPU (a tick with at "
                 "least 2 % of a core); grows while it sleeps, is blocked or is frozen.")
IO_IDLE = _rank("llmmon_rank_io_idle_seconds", "gauge",
                "Seconds since the rank's process last read or wrote 256 kB in a tick.")
WAITING = _rank("llmmon_rank_waiting", "gauge",
                "1 while the rank waits inside an operation of one of its process groups (a "
                "collective the Flight Recorder has in flight, or a send, receive or collective "
                "its frames are blocked in) while its job may hang (a group waits 5 s or more, "
                "or is stalled); no series otherwise, nor for a stopped rank. A waiting rank is "
                "behind in its other groups without being to blame: the hang rules never name "
                "it.")
DOING_INFO = MetricSpec(
    "llmmon_rank_doing_info", "info",
    "What a rank completing nothing is doing: the process state (procfs, empty when not "
    "visible) and where its training thread is (innermost frame of the job's code, and the "
    "library call it is in). Only while the rank completes nothing, or is stopped.",
    RANK + ("state", "where"))
ISSUED = MetricSpec(
    "llmmon_nccl_inflight_collective_info", "info",
    "What each rank issued as its group's oldest uncompleted collective (operation, bytes, "
    "element type): exported once the group has waited 5 s in it, or its job ended with it in "
    "flight. Ranks of a group must agree at each sequence number; the rules name the rank that "
    "differs from the others across nodes (LLMTrainingDesync).",
    ("job_id", "pg", "rank", "seq", "signature"))
USUAL = MetricSpec(
    "llmmon_nccl_desync_usual_info", "info",
    "At a desync this node's ranks split evenly on, the signature the group's own last 64 "
    "collectives back (the other rank is the odd one; exported with "
    "llmmon_nccl_inflight_collective_info).", ("job_id", "pg", "seq", "signature"))
STALL_THRESHOLD = MetricSpec(
    "llmmon_nccl_stall_threshold_seconds", "gauge",
    "How long the group may complete nothing while ranks wait before it is stalled: "
    "stall_factor x the p99 gap between its collectives or step time, within "
    "[stall_floor, stall_after] (stall_after until learned).", ("job_id", "pg"))
STALLED = MetricSpec(
    "llmmon_nccl_stalled_seconds", "gauge",
    "How long the group has completed nothing while a rank waits in a collective, as of the "
    "daemon's read (0: nothing waits); stalled beyond llmmon_nccl_stall_threshold_seconds.",
    ("job_id", "pg"))
GROUP_PROGRESS = MetricSpec(
    "llmmon_nccl_group_last_progress_timestamp_seconds", "gauge",
    "The newest llmmon_nccl_last_progress_timestamp_seconds of the group's ranks on this node: "
    "one series a group, which the hang rules read to ask which groups completed nothing for the "
    "hang window before they read any rank's series.", ("job_id", "pg"))
QUIET = MetricSpec(
    "llmmon_nccl_quiet_seconds", "gauge",
    "How long no rank of the job on this node enqueued or completed a collective of any group, "
    "while nothing of this group is in flight and a rank still reports or is stopped (0 "
    "otherwise): every rank here stuck before its next collective, or frozen. Stalled beyond "
    "llmmon_nccl_stall_threshold_seconds (LLMTrainingHang, reason=no_rank_enqueues).",
    ("job_id", "pg"))
READ = MetricSpec(
    "llmmon_ranks_spool_read_bytes_total", "counter",
    "Bytes of spool files the daemon read: each new version of a state or whole-ring entries "
    "file, and of an entries log only what was appended since the last read.")
SANITISED = MetricSpec("llmmon_ranks_labels_sanitised_total", "counter",
                       "Label values cut to a safe alphabet or length, by field.", ("field",))
CUT = MetricSpec(
    "llmmon_nccl_spool_cut_total", "counter",
    "Items of spool files left out to bound the daemon's memory, by reason: groups (beyond 64 a "
    "document), rank_spans (groups listing over 64 spans), inflight_entries (beyond 2,048 a "
    "state file), blocked (ops a rank waits in, beyond 16 a state file), series (samples over "
    "64 counter series a rank), read_budget (a changed file left for the next run: "
    "max_read_bytes or half the collector's timeout spent), unnamed_group (a group's progress "
    "whose Flight Recorder id the reporter could not pair with the group's name: its records "
    "left the ring before the reporter started).",
    ("reason",))
GAP = MetricSpec(
    "llmmon_nccl_collective_gap_seconds", "gauge",
    "Mean seconds per collective of the group between two of its ranks' reports 10-20 s apart "
    "(else their 10 newest Flight Recorder gaps): its pace now; absent while idle for 30 s.",
    ("job_id", "pg"))
GAP_BASELINE = MetricSpec(
    "llmmon_nccl_collective_gap_baseline_seconds", "gauge",
    "The group's fastest mean gap of an earlier 30 s still in its ranks' Flight Recorder "
    "index: llmmon_nccl_collective_gap_seconds over this is how much slower the job runs than "
    "its own pace.", ("job_id", "pg"))
GAP_INSIDE = MetricSpec(
    "llmmon_nccl_collective_gap_inside_ratio", "gauge",
    "Of the seconds per collective the group's gap grew by over its baseline, the share its "
    "ranks on this node spend inside collectives (from whether each status report had one in "
    "flight, over the last 20 s and in the baseline's window): near 1 a slow link, near 0 late "
    "together (the input pipeline); only for the job's slowest group at least 2x slower than "
    "its baseline with no rank on this node late (a rank that is leaves it absent).",
    ("job_id", "pg"))
_NETNS = ("job_id", "netns")
TCP_SENT = MetricSpec(
    "llmmon_tcp_segments_sent_total", "counter",
    "TCP segments sent in a network namespace of the job's ranks (Tcp OutSegs of "
    "/proc/<rank pid>/net/snmp; netns: the pod of its lowest rank here, or host).", _NETNS)
TCP_RETRANSMITTED = MetricSpec(
    "llmmon_tcp_segments_retransmitted_total", "counter",
    "TCP segments retransmitted in a network namespace of the job's ranks (Tcp RetransSegs): "
    "gloo and NCCL's socket transport over a lossy or congested link.", _NETNS)
TCP_TIMEOUTS = MetricSpec(
    "llmmon_tcp_timeouts_total", "counter",
    "TCP retransmission timeouts in a network namespace of the job's ranks (TcpExt "
    "TCPTimeouts): a segment lost and not recovered by fast retransmit.", _NETNS)


STACK_UNCHANGED = MetricSpec(
    "llmmon_job_stack_unchanged_seconds", "gauge",
    "Of a job whose ranks here run without the reporter: how long every rank's stack has "
    "stayed the same (py-spy samples close together); hung beyond "
    "llmmon_job_stack_threshold_seconds.", ("job_id",))
STACK_THRESHOLD = MetricSpec(
    "llmmon_job_stack_threshold_seconds", "gauge",
    "How long a job without the reporter may hold every stack still: stall_factor x the "
    "longest it held them still while training, within [stall_floor, stall_after].",
    ("job_id",))
STACK_ROOT = MetricSpec(
    "llmmon_rank_stack_root", "gauge",
    "1 for a rank of a job hung by its stacks (no reporter) that waits on nothing: in the job's "
    "own code (a loader, a lock, a sleep), stopped, or alone in another collective than its "
    "peers (LLMTrainingHang, reason=stack_root).", RANK)
STACK_SYMMETRIC = MetricSpec(
    "llmmon_job_stack_symmetric_info", "info",
    "A job hung by its stacks (no reporter) whose every rank here waits in the same "
    "collective: no rank here is to blame (LLMTrainingHang, reason=stack_symmetric).",
    ("job_id", "op"))
STACK_OP = MetricSpec(
    "llmmon_rank_stack_op_info", "info",
    "Of a job hung by its stacks (no reporter): the collective a rank's frames are blocked in "
    "(op; not a send or receive, which differ by design). Across nodes, a rank in another "
    "collective than most of the job's, while no rank waits on nothing, is a desync "
    "(LLMTrainingDesync, reason=stack_op).", RANK + ("op",))
STACK_SAMPLES = MetricSpec(
    "llmmon_ranks_stack_samples_total", "counter",
    "py-spy stack samples of ranks without the reporter, by result: taken, failed (the "
    "process went, or no permission: see the log), over_budget (skipped: the CPU budget was "
    "spent).", ("result",))
STACK_CPU = MetricSpec(
    "llmmon_ranks_stack_cpu_seconds_total", "counter",
    "CPU time the daemon spent in py-spy, within --collector.ranks.stack-budget.", ())


class RanksCollector(Collector):
    name = "ranks"
    description = ("Training ranks from the reporter spool: PyTorch memory, NCCL progress, "
                   "timings and bytes, step metrics; hang evidence at /api/v1/ranks.")
    specs = (RANK_INFO, RANK_UP, REPORT_AGE, REPORTER_DISABLED, REPORTER_ERRORS, ALLOCATOR_INFO,
             *(spec for spec, _ in MEMORY), ENQUEUED, STARTED, COMPLETED, PROGRESS, INFLIGHT,
             LAG, MARK, DURATION, BYTES, BUS_BYTES, MISSED, PG_INFO, DUMPS_REQUESTED, DUMPS_KEPT,
             STEPS, STEP_SECONDS, TOKENS, FLOPS, NONFINITE, REJECTED, READ, SANITISED, CUT, ALIVE,
             EXIT_CODE, CPU_SECONDS, READ_BYTES, WRITTEN_BYTES, SWITCHES, CPU_IDLE, IO_IDLE,
             WAITING, DOING_INFO, ISSUED, USUAL, STALL_THRESHOLD, STALLED, GROUP_PROGRESS, QUIET,
             GAP, GAP_BASELINE, GAP_INSIDE, TCP_SENT, TCP_RETRANSMITTED, TCP_TIMEOUTS,
             STACK_UNCHANGED, STACK_THRESHOLD, STACK_ROOT, STACK_SYMMETRIC, STACK_OP,
             STACK_SAMPLES, STACK_CPU)
    options = (
        Option("spool_dir", "str", DEFAULT_SPOOL,
               "Directory the training-process reporters write to (LLMMON_SPOOL).",
               flag="--spool.dir", metavar="DIR"),
        Option("stale_after", "duration", "30s",
               "A rank whose file is older than this is reported down (llmmon_rank_up 0).",
               minimum="1s", maximum="24h"),
        Option("drop_after", "duration", "10m",
               "A rank silent this long is dropped and its spool files deleted.",
               minimum="1s", maximum="720h"),
        Option("stall_after", "duration", "180s",
               "The ceiling: no progress for this long while ranks wait marks a group stalled "
               "in /api/v1/ranks and `llmmon diagnose --ranks` whatever the job's pace (and "
               "while its pace is not learned yet, and while the rank behind is busy).",
               minimum="1s", maximum="24h"),
        Option("stall_floor", "duration", "10s",
               "The learned stall threshold is never shorter than this.",
               minimum="100ms", maximum="24h"),
        Option("stall_factor", "float", 5.0,
               "The learned stall threshold: this many times the p99 gap between a group's "
               "collectives (or step time).", minimum=1.0, maximum=1000.0),
        Option("pid_poll", "duration", "100ms",
               "How often the ranks' /proc/<pid> are polled (state, CPU, exit) while a rank's "
               "pidfd cannot be held; with every rank's held (their exits seen at once through "
               "them), or no rank on the node, once a second or at this interval if longer.",
               minimum="10ms", maximum="1m"),
        Option("auto_dump", "bool", True,
               "Request a Flight Recorder dump from a job once a group stalls for dump_after."),
        Option("dump_after", "duration", "3m",
               "Stall time before the automatic dump; keep it under the NCCL watchdog (10 min) "
               "and heartbeat monitor (8 min) timeouts.", minimum="1s", maximum="24h"),
        Option("fr_dir", "str", DEFAULT_FR_DIR,
               "Where Flight Recorder dumps land (dump file prefix FR_DIR/JOB/rank_).",
               metavar="FR_DIR"),
        Option("pipe_dir", "str", DEFAULT_PIPE_DIR,
               "Where the dump pipes are (PIPE_DIR/JOB/rank_RANK.pipe).", metavar="PIPE_DIR"),
        Option("dump_interval", "duration", "30s",
               "Least time between two dumps of one job asked over POST /api/v1/ranks/dump: "
               "each one reaches every rank of the job; one asked sooner gets 429.",
               minimum="1s", maximum="1h"),
        Option("dumps_keep", "int", 8,
               "Dump sets kept per job for post-mortems (newest first; only sets the daemon "
               "made count or are deleted).", minimum=1, maximum=1000),
        Option("max_file_bytes", "int", 16 << 20,
               "Larger spool files are refused (18.5k NCCL entries make ~10 MB).",
               metavar="BYTES", minimum=4096, maximum=1 << 30),
        Option("max_read_bytes", "int", 32 << 20,
               "Bytes of changed spool files parsed per run at most (and no more once half the "
               "timeout is spent); the rest wait for the next run, each job's newest first.",
               metavar="BYTES", minimum=65536, maximum=1 << 32),
        Option("max_files", "int", 512,
               "Spool files read per run at most, shared round-robin by the jobs.",
               minimum=1, maximum=100_000),
        Option("max_files_per_job", "int", 64,
               "Spool files read per run from one job directory at most (its newest).",
               minimum=1, maximum=100_000),
        Option("discover", "bool", True,
               "Also follow training ranks that run without the reporter, found in procfs by "
               "torch's distributed environment (RANK and WORLD_SIZE with torchrun's variables, "
               "or a Slurm task with torch loaded): needs the host's PID namespace and the "
               "right to read other users' /proc/<pid>/environ (root or CAP_SYS_PTRACE)."),
        Option("pyspy", "str", "py-spy",
               "The py-spy executable that reads the stacks of ranks without the reporter "
               "(CAP_SYS_PTRACE); empty: no stacks, those ranks are followed by procfs alone.",
               metavar="PATH"),
        Option("stack_interval", "duration", "5s",
               "How often each rank without the reporter has its stack read; over 6 s, a "
               "healthy job's still periods are measured only while it looks hung.",
               minimum="1s", maximum="1h"),
        Option("stack_quick_interval", "duration", "2s",
               "How often while its job looks hung (its last stacks alike, or its ranks "
               "without CPU); under 6 s, or stillness is never confirmed.",
               minimum="500ms", maximum="5s"),
        Option("stack_budget", "float", 0.1,
               "CPU seconds per second the daemon may spend in py-spy (a dump of a small "
               "process costs ~12 ms: 8 ranks every 5 s use 0.02); samples beyond it wait, a "
               "suspect job's first, and are counted.", minimum=0.001, maximum=4.0),
        Option("max_ranks", "int", 64, "Ranks followed at most (cardinality bound).",
               minimum=1, maximum=10_000),
        Option("max_ranks_per_job", "int", 32, "Ranks of one job followed at most.",
               minimum=1, maximum=10_000),
        Option("max_ranks_per_uid", "int", 48,
               "Ranks followed at most whose spool files one user owns: one local user's files "
               "never take every place (above max_ranks_per_job: the jobs of pods that all "
               "run as root share it).", minimum=1, maximum=10_000),
    )
    interval = 5.0
    timeout = 4.0

    def __init__(self, env, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__(env, config)
        self.clock = DaemonClock()  # stall ages, staleness and sweeps: immune to clock steps
        self.ledger = Ledger(config["max_ranks"], config["max_ranks_per_job"],
                             seen_alive(env.procfs), config["max_ranks_per_uid"])
        self.source = SpoolSource(config["spool_dir"], config["max_file_bytes"],
                                  config["max_files"], config["max_files_per_job"])
        self.ingest = SpoolIngest(self.source, self.ledger, config["stale_after"],
                                  config["drop_after"], config["max_read_bytes"],
                                  config["timeout"] / 2,  # the rest: evidence, rendering
                                  self.clock.offset)
        self.keeper = dumps.DumpKeeper(config["fr_dir"], config["dumps_keep"])
        self._rejected: Counter[str] = Counter()
        self._sanitised: Counter[str] = Counter()
        self._cut: Counter[str] = Counter()
        self._read_bytes = 0
        self._dumps_requested: Counter[str] = Counter()
        self._dump_asked: dict[str, float] = {}  # job -> monotonic time of its last HTTP dump
        self._dumped: set[tuple[str, str, int]] = set()
        self._kept = 0
        self._lock = threading.Lock()
        self.watch = PidWatch(env.procfs, config["pid_poll"], self.clock.now)
        self.tcp = TcpWatch(env.procfs)
        self.outside = self._outside(env, config)
        self._seen: dict[str, StackVerdict] = {}
        self._stack_errors: dict[str, str] = {}
        self._evidence: stall.Evidence = self._judge(self.clock.now())

    def _outside(self, env, config) -> OutsideRanks | None:  # type: ignore[no-untyped-def]
        if not config["discover"]:
            return None
        binary = pyspy.find_binary(config["pyspy"]) if config["pyspy"] else None
        if config["pyspy"] and binary is None:
            log.warning("no py-spy executable %r: ranks without the reporter are followed by "
                        "procfs alone, without stacks", config["pyspy"])
        sampler = None if binary is None else StackSampler(
            binary, config["stack_interval"], config["stack_quick_interval"],
            config["stack_budget"], self.clock.now)
        return OutsideRanks(env.procfs, sampler, config["stall_floor"], config["stall_factor"],
                            config["stall_after"])

    def start(self) -> None:
        self.watch.start()
        if self.outside is not None and self.outside.sampler is not None:
            self.outside.sampler.start()

    def close(self) -> None:
        self.watch.close()
        if self.outside is not None and self.outside.sampler is not None:
            self.outside.sampler.close()

    def _judge(self, now: float) -> stall.Evidence:
        limits = stall.StallThresholds(self.config["stale_after"], self.config["stall_after"],
                                       self.config["stall_floor"], self.config["stall_factor"])
        return stall.judge(self.ledger, now, limits, self.watch, self.tcp, self._seen)

    def api(self) -> dict[str, Any]:
        return {"ranks": self.evidence}

    def latest(self) -> stall.Evidence:
        """The verdicts of the last run, typed (the incidents collector reads them)."""
        with self._lock:
            return self._evidence

    def actions(self) -> dict[str, Any]:
        return {"ranks/dump": self.request_dump}

    def request_dump(self, query: dict[str, str]) -> dict[str, Any]:
        """POST /api/v1/ranks/dump?job_id=J: a Flight Recorder dump from J's ranks here now."""
        job_id = query.get("job_id", "")
        with self._lock:
            jobs = {job.job_id: job for job in self._evidence.jobs}
        if not job_id:
            raise ValueError("job_id is required: POST /api/v1/ranks/dump?job_id=<job>; "
                             f"jobs here: {sorted(jobs)}")
        if job_id not in jobs:
            raise ValueError(f"unknown job_id {job_id!r}; known here: {sorted(jobs)}")
        self._admit_dump(job_id)
        ranks = [r.rank for r in jobs[job_id].ranks]
        results = dumps.request(self.config["pipe_dir"], job_id, ranks)
        with self._lock:
            self._dumps_requested[job_id] += 1
        log.warning("job %s: Flight Recorder dump requested over HTTP: %s", job_id, results)
        return {"job_id": job_id, "ranks": {str(r): v for r, v in results.items()}}

    def _admit_dump(self, job_id: str) -> None:
        """One dump of a job per dump_interval, on the monotonic clock: each reaches every
        rank's pipe, and a client asking in a loop must cost the trainers and the log no
        more than that."""
        now, interval = time.monotonic(), self.config["dump_interval"]
        with self._lock:
            last = self._dump_asked.get(job_id)
            if last is not None and now - last < interval:
                raise RouteError(429, f"job {job_id}: a dump was asked {now - last:.1f}s ago; "
                                      f"one per {interval:g}s (--collector.ranks.dump-interval)")
            self._dump_asked[job_id] = now

    def evidence(self) -> dict[str, Any]:
        """The /api/v1/ranks document of the latest run."""
        with self._lock:
            judged = self._evidence
        return judged.json()

    def collect(self, ctx: Context) -> Iterable[Metric]:
        return self.collect_at(ctx, self.clock.now())

    def collect_at(self, ctx: Context, now: float) -> Families:
        """One run as of Unix time `now` (tests replay fixture spools at a fixed time)."""
        result = self.ingest.run(now)
        for problem in result.problems:
            ctx.error(problem.key, problem.message)
            self._rejected[problem.reason] += 1
        for problem in result.persisting:
            ctx.persists(problem.key, problem.message)
        self._sanitised.update(result.sanitised)
        self._cut.update(result.cut)
        self._read_bytes += result.read_bytes
        self._follow_outside(ctx, now)
        self.watch.follow({(t.state.identity.job_id, t.state.identity.rank, t.pid):
                           t.state.identity.start_ticks for t in self.ledger.tracks.values()})
        self.watch.poll(now)
        for key, message in self.tcp.read(self._members(), now):
            ctx.error(key, message)
        evidence = self._judge(now)
        with self._lock:
            self._evidence = evidence
        self._dump(ctx, evidence, now)
        if not self.source.exists():
            ctx.watching(0, f"no spool directory {self.source.root}")
        else:
            ctx.watching(len(self.ledger.tracks), "ranks in the spool")
        return self._families(now, evidence)

    def _follow_outside(self, ctx: Context, now: float) -> None:
        """Feed the ledger the ranks that run without the reporter; the reporter's evidence
        of a rank wins over what is seen from outside."""
        if self.outside is None:
            return
        reported = {key: t.pid for key, t in self.ledger.tracks.items()
                    if t.state.health.fr_api != SEEN_FROM_OUTSIDE}
        run = self.outside.run(now, reported, self.watch)
        if run.notes.dropped:
            ctx.error("procfs", f"ranks seen from outside: dropped {run.notes.dropped}, first: "
                                f"{run.notes.first_drop}")
        self._sanitised.update(run.notes.sanitised)
        for found, state in run.states:
            known = self.ledger.tracks.get((found.job_id, found.rank))
            if known is not None and known.state.health.fr_api != SEEN_FROM_OUTSIDE:
                continue
            if not self.ledger.observe_state(state, now, now, found.uid):
                ctx.error(f"pid {found.pid}", f"job {found.job_id} rank {found.rank} (pid "
                          f"{found.pid}): more than {self.ledger.max_ranks} ranks followed; "
                          "skipped")
        self._seen = run.verdicts
        sampler = self.outside.sampler
        if sampler is not None:
            errors = {f"py-spy {pid}": error for (pid, _), error in sampler.errors.items()}
            for key, error in sorted(errors.items()):
                if self._stack_errors.get(key) == error:
                    ctx.persists(key, error)
                else:
                    ctx.error(key, error)
            self._stack_errors = errors

    def _members(self) -> dict[str, list[Member]]:
        """Each job's ranks with their processes as the PID watch sees them."""
        return {job_id: [Member(t.state.identity.rank, t.pid, t.state.identity.pod,
                                self.watch.get((job_id, t.state.identity.rank, t.pid)))
                         for t in tracks]
                for job_id, tracks in self.ledger.jobs().items()}

    def _dump(self, ctx: Context, evidence: stall.Evidence, now: float) -> None:
        """Request one dump per stall (job, group, stuck sequence); keep the newest sets."""
        for job in evidence.jobs:
            for group in job.groups:
                stuck = (job.job_id, group.pg, group.last_completed)
                if (not self.config["auto_dump"] or not group.stalled or stuck in self._dumped
                        or group.stalled_seconds < self.config["dump_after"]):
                    continue
                self._dumped.add(stuck)
                ranks = [r.rank for r in job.ranks]
                results = dumps.request(self.config["pipe_dir"], job.job_id, ranks)
                self._dumps_requested[job.job_id] += 1
                log.warning("%s; requested a Flight Recorder dump: %s", group.summary(), results)
        live = {job.job_id for job in evidence.jobs}
        self._dumped = {key for key in self._dumped if key[0] in live}
        with self._lock:  # a job's dump counter goes with its ranks, as its other series do
            for job_id in self._dumps_requested.keys() - live:
                del self._dumps_requested[job_id]
            for job_id in self._dump_asked.keys() - live:
                del self._dump_asked[job_id]
        try:
            self._kept = self.keeper.harvest(now)
        except OSError as exc:
            ctx.error("dumps", f"keeping Flight Recorder dumps in {self.keeper.fr_dir}: {exc}")

    # rendering -------------------------------------------------------------------------
    def _families(self, now: float, evidence: stall.Evidence) -> Families:
        families = Families()
        stale_after = self.config["stale_after"]
        judged = {job.job_id: job for job in evidence.jobs}
        for job, tracks in self.ledger.jobs().items():
            for track in tracks:
                self._rank_families(families, track, now, stale_after)
            self._judged_families(families, judged[job])
            for pg, lags in judged[job].enqueue_lag.items():
                for rank, lag in lags.items():
                    families.add(LAG, [job, str(rank), pg], lag)
            up = [t for t in tracks if t.age(now) <= stale_after]
            for pg in sorted({pg for t in up for pg in t.state.progress}):
                for track in (t for t in up if pg in t.state.progress):
                    if (mark := track.mark(pg)) is not None:
                        families.add(MARK, [job, str(track.state.identity.rank), pg,
                                            str(mark[0])], mark[1] / 1e9)
            self._group_families(families, job, tracks)
        for job_id, netns, stats in self.tcp.series():
            families.add(TCP_SENT, [job_id, netns], stats.sent)
            families.add(TCP_RETRANSMITTED, [job_id, netns], stats.retransmitted)
            if stats.timeouts is not None:
                families.add(TCP_TIMEOUTS, [job_id, netns], stats.timeouts)
        for job_id, count in sorted(self._dumps_requested.items()):
            families.add(DUMPS_REQUESTED, [job_id], count)
        self._outside_families(families, evidence)
        families.add(DUMPS_KEPT, [], self._kept)
        for reason, count in sorted(self._rejected.items()):
            families.add(REJECTED, [reason], count)
        families.add(READ, [], self._read_bytes)
        for field, count in sorted(self._sanitised.items()):
            families.add(SANITISED, [field], count)
        for reason, count in sorted(self._cut.items()):
            families.add(CUT, [reason], count)
        return families

    def _outside_families(self, families: Families, evidence: stall.Evidence) -> None:
        """The stack verdicts of jobs without the reporter, and what their stacks cost."""
        for job in evidence.jobs:
            seen = job.stacks
            if seen is None:
                continue
            families.add(STACK_UNCHANGED, [job.job_id], seen.unchanged)
            families.add(STACK_THRESHOLD, [job.job_id], seen.threshold)
            for rank in job.verdict.roots:
                families.add(STACK_ROOT, [job.job_id, str(rank)], 1)
            if job.verdict.stalled and seen.symmetric:
                families.add(STACK_SYMMETRIC, [job.job_id, seen.symmetric], 1)
            if job.verdict.stalled:
                for rank, op in sorted(seen.waits.items()):
                    if collective(op):
                        families.add(STACK_OP, [job.job_id, str(rank), op], 1)
        sampler = self.outside.sampler if self.outside else None
        if sampler is not None and any(sampler.counts.values()):
            # a node whose every rank has the reporter pays no series for the py-spy sampler
            for result in ("taken", "failed", "over_budget"):
                families.add(STACK_SAMPLES, [result], sampler.counts[result])
            families.add(STACK_CPU, [], sampler.cpu_seconds)

    @staticmethod
    def _judged_families(families: Families, job: stall.JobEvidence) -> None:
        """What the hang evidence decided, for the rules to judge with the same numbers."""
        job_id = job.job_id
        # waits are exported once the job may hang: a healthy job's ranks are in and out of
        # collectives all the time, and every rank's series would spend the node's budget
        hanging = job.verdict.stalled or any(
            g.outstanding is not None and (g.outstanding.waiting_seconds or 0.0)
            >= stall.ISSUED_AFTER for g in job.groups)
        for rank in job.ranks:
            labels = [job_id, str(rank.rank)]
            families.add(ALIVE, labels, 1 if rank.alive else 0)
            if rank.end is not None and rank.end.code is not None:
                families.add(EXIT_CODE, labels, rank.end.code)
            doing = rank.doing
            for spec, idle in ((CPU_IDLE, doing.cpu_idle), (IO_IDLE, doing.io_idle)):
                if idle is not None:
                    families.add(spec, labels, round(idle, 1))  # as /api/v1/ranks shows it
            if hanging and job.verdict.graph.waiting(rank.rank) and not doing.stopped:
                families.add(WAITING, labels, 1)
            if rank.alive and (rank.state.stack or doing.stopped):
                families.add(DOING_INFO, labels + [doing.state, doing.where], 1)
        for group in job.groups:
            _verdict_families(families, job_id, group)
        slow = job.slowdown  # the group judged slowed evenly here: no local rank late
        if slow and slow["gap"]["added_inside_share"] is not None:
            families.add(GAP_INSIDE, [job_id, slow["pg"]], slow["gap"]["added_inside_share"])

    @staticmethod
    def _group_families(families: Families, job: str, tracks: list[RankTrack]) -> None:
        seen: set[str] = set()
        for track in tracks:
            for pg, group in sorted(track.groups().items()):
                if pg not in seen:
                    seen.add(pg)
                    families.add(PG_INFO, [job, pg, group.desc, str(group.size),
                                           stall.group_ranks(group), dimension.of(group.desc)],
                                 1)

    @staticmethod
    def _rank_families(families: Families, track: RankTrack, now: float,
                       stale_after: float) -> None:
        state, who = track.state, track.state.identity
        labels = [who.job_id, str(who.rank)]
        source = "procfs" if state.health.fr_api == SEEN_FROM_OUTSIDE else "reporter"
        families.add(RANK_INFO, labels + [str(who.local_rank), str(who.world_size), who.uuid,
                                          who.pod, who.namespace, str(who.pid), source], 1)
        families.add(RANK_UP, labels, 1 if track.age(now) <= stale_after else 0)
        families.add(REPORT_AGE, labels, track.age(now))
        families.add(REPORTER_DISABLED, labels, 1 if state.health.disabled else 0)
        families.add(REPORTER_ERRORS, labels, state.health.errors_total)
        families.add(MISSED, labels, track.missed)
        if who.allocator_config:
            families.add(ALLOCATOR_INFO, labels + [who.allocator_config], 1)
        if state.memory is not None:
            for spec, key in MEMORY:
                if key in state.memory:
                    families.add(spec, labels, state.memory[key])
        for pg, progress in sorted(state.progress.items()):
            pg_labels = labels + [pg]
            families.add(ENQUEUED, pg_labels, progress.enqueued)
            families.add(STARTED, pg_labels, progress.started)
            families.add(COMPLETED, pg_labels, progress.completed)
            noted = track.last_progress(pg)
            if noted is not None:
                families.add(PROGRESS, pg_labels, noted)
            families.add(INFLIGHT, pg_labels, track.inflight_age(pg, now))
        for (pg, coll, dtype), value in sorted(track.collective_bytes.items()):
            families.add(BYTES, labels + [pg, coll, dtype], value)
        for (pg, coll), value in sorted(track.bus_bytes.items()):
            families.add(BUS_BYTES, labels + [pg, coll], value)
        for (pg, coll), histogram in sorted(track.durations.items()):
            families.add_histogram(DURATION, labels + [pg, coll],
                                   _cumulative(DURATION_BUCKETS, histogram.counts),
                                   histogram.total)
        activity = state.activity
        if activity is not None:
            families.add(CPU_SECONDS, labels, activity.cpu_seconds)
            families.add(READ_BYTES, labels, activity.read_bytes)
            families.add(WRITTEN_BYTES, labels, activity.written_bytes)
            families.add(SWITCHES, labels + ["voluntary"], activity.voluntary_switches)
            families.add(SWITCHES, labels + ["involuntary"], activity.involuntary_switches)
        steps = state.steps
        if steps is not None:
            families.add(STEPS, labels, steps.steps)
            families.add(TOKENS, labels, steps.tokens)
            families.add(FLOPS, labels, steps.model_flops)
            families.add(NONFINITE, labels, steps.loss_nonfinite)
            families.add_histogram(STEP_SECONDS, labels,
                                   _cumulative(steps.buckets, steps.counts), steps.seconds_sum)


def _verdict_families(families: Families, job_id: str, group: stall.GroupVerdict) -> None:
    """A group's verdict in the numbers the hang rules read."""
    labels = [job_id, group.pg]
    for rank, signature in group.issued.items():
        families.add(ISSUED, labels + [str(rank), str(group.frontier), signature], 1)
    found = group.desync
    if group.issued and found and found["basis"] == "history":
        families.add(USUAL, labels + [str(found["seq"]), found["majority"]], 1)
    families.add(STALL_THRESHOLD, labels, group.threshold_seconds)
    families.add(STALLED, labels, group.stalled_seconds)
    families.add(QUIET, labels, group.quiet_seconds)
    if group.last_progress is not None:
        families.add(GROUP_PROGRESS, labels, group.last_progress)
    if group.gap is not None:  # to the 0.1 ms, as /api/v1/ranks shows them
        families.add(GAP, labels, round(group.gap.recent, 4))
        if group.gap.baseline is not None:
            families.add(GAP_BASELINE, labels, round(group.gap.baseline, 4))


def _cumulative(bounds: tuple[float, ...], counts: list[int] | tuple[int, ...]
                ) -> list[tuple[str, float]]:
    """Per-bucket counts (one more than bounds, the last for +Inf) as Prometheus buckets."""
    buckets, running = [], 0
    for bound, count in zip(list(bounds) + [float("inf")], counts):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    return buckets
