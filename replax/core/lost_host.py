"""A process lost mid-run: with several processes, the others stop within a minute with
one line that says which process was lost and how to resume, instead of hanging in a
collective until jax's heartbeat timeout aborts them with a C++ log and a traceback.

Two parts, both for runs of several processes only:
- `supervise`: scripts/train.py forks before jax starts (no jax.distributed, no device
  yet). The child trains; the parent relays the child's stderr and waits for it. A
  lost peer ends the child one of two ways: its `PeerWatch` reports the loss and
  leaves, or, when process 0 (the host of jax's coordination service) is the one lost,
  jax's client aborts the child within a second, from C++, before any Python code can
  act. Either way the parent holds back what the child printed from its first failure
  line on, prints the one line instead, and exits with EXIT_PEER_LOST. Any other
  failure's output is relayed as it was.
- `PeerWatch`: threads in the child. Each process bumps a counter in jax.distributed's
  key-value store every `interval_s` and reads everyone's; a peer whose counter has not
  moved for `timeout_s`, or a store out of reach for as long, is lost: the watch tells
  the parent and ends the process at once (os._exit: nothing then waits on the dead
  peer, in a collective, in a checkpoint's barrier or at exit). `timeout_s` stays well
  under jax's own heartbeat timeout (100 s), which would abort the process first.

A checkpoint under way when a peer dies is never sealed: orbax seals and commits a step
only once every process has written its part (replax.run.checkpoint), and the survivors
leave before that can happen. So the next run resumes from the last sealed one.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable

# Exit status of a process whose run lost another process: run the same command on
# every process again to resume.
EXIT_PEER_LOST = 4
# The child's reports to the parent, on its stderr: `MARK processes N` (at start),
# `MARK step N` (each step done), `MARK lost P`.
MARK = "\x1freplax "
SUPERVISED = "REPLAX_SUPERVISED"
# Lines that start a failure's output (a Python traceback, an absl fatal line or a
# warning or error of jax's distributed runtime, a C++ abort, faulthandler's dump).
_FAILURE = re.compile(
    r"^(Traceback |F\d{4} |[WE]\d{4} .*(coordination|preemption|distributed|[Gg]loo|heartbeat)|"
    r"\*\*\* |Fatal Python error|terminate called|jax\.errors\.|Exception ignored)"
)
# What jax's client says when it aborts for a lost peer (the lost process, when it
# names it, as a group of the second pattern).
_LEADER_LOST = re.compile(r"leader task was preempted/died|Failed to send RPC to coordination")
_TASK_LOST = re.compile(r"stopped sending heartbeats\):\s*(\d+)|Task (\d+) heartbeat timeout")


def is_multi_host(environ=os.environ) -> bool:
    """Whether the launcher started several processes: an explicit coordinator or process
    count, a TPU slice of more than one host, or a SLURM job of more than one task."""
    if environ.get("JAX_COORDINATOR_ADDRESS"):
        return True
    if int(environ.get("JAX_NUM_PROCESSES") or 1) > 1:
        return True
    for key in ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES"):
        if len(environ.get(key, "localhost").split(",")) > 1:
            return True
    return int(environ.get("SLURM_NTASKS", "1")) > 1


def lost_line(lost: int, num_processes: int | None, step: int | None, resume: int | None) -> str:
    """The one line a process prints when process `lost` of the run was lost."""
    of = "" if num_processes is None else f" of {num_processes}"
    where = "" if step is None else f" at step {step}"
    then = f"resume from step {resume}" if resume else "start again from step 0"
    return (
        f"replax: process {lost}{of} was lost{where}; run the same command "
        f"on every process to {then}"
    )


class Relay:
    """The parent's side: lines of the child's stderr in, the user's stderr out."""

    def __init__(self, out=None):
        self.num_processes: int | None = None
        self.out = out or sys.stderr
        self.step: int | None = None
        self.lost: int | None = None
        self.held: list[str] = []

    def feed(self, line: str) -> None:
        if line.startswith(MARK):
            what, value = line[len(MARK) :].split()
            if what == "processes":
                self.num_processes = int(value)
            elif what == "step":
                self.step = int(value)
            elif self.lost is None:
                self.lost = int(value)
        elif self.held or _FAILURE.match(line):
            self.held.append(line)
        else:
            self.out.write(line)
            self.out.flush()

    def lost_process(self) -> int | None:
        """The lost process, from the child's report or from jax's abort message."""
        if self.lost is not None:
            return self.lost
        text = "".join(self.held)
        if _LEADER_LOST.search(text):
            return 0
        found = _TASK_LOST.search(text)
        return None if found is None else int(found.group(1) or found.group(2))

    def finish(self, exit_code: int, resume_step: Callable[[], int | None]) -> int:
        """The parent's exit status, once the child has exited with exit_code: after a
        lost peer, EXIT_PEER_LOST and the one line; otherwise the child's own, with the
        lines held back relayed."""
        lost = self.lost_process() if exit_code else None
        if lost is None:
            self.out.write("".join(self.held))
            self.out.flush()
            return exit_code
        self.out.write(lost_line(lost, self.num_processes, self.step, resume_step()) + "\n")
        self.out.flush()
        return EXIT_PEER_LOST


def _die_with_parent() -> None:
    """The child is killed when its parent dies (Linux), so that killing the command a
    launcher started kills the training process too."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def supervise(resume_step: Callable[[], int | None]) -> None:
    """Forks. Returns in the child, which goes on to train; the parent relays the child's
    stderr, waits for it and exits (see the module doc). Call before jax starts: before
    jax.distributed.initialize and before anything asks for devices.

    SIGTERM reaches the child through the parent; SIGINT from a terminal reaches both,
    so the parent ignores it and lets the child stop as it does alone."""
    sys.stdout.flush(), sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        os.close(read_fd)
        _die_with_parent()
        if os.getppid() != parent:  # the parent died before prctl
            os._exit(EXIT_PEER_LOST)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        os.environ[SUPERVISED] = "1"
        return
    os.close(write_fd)
    signal.signal(signal.SIGTERM, lambda signum, frame: os.kill(child, signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    relay = Relay()
    with os.fdopen(read_fd, errors="replace") as lines:
        for line in lines:
            relay.feed(line)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
    os._exit(relay.finish(code, resume_step))


_STEP: list[int | None] = [None]  # the last step reported


def report(what: str, value: int) -> None:
    """Tells the supervising parent (when there is one) the step or the lost process."""
    if what == "step":
        _STEP[0] = value
    if os.environ.get(SUPERVISED):
        os.write(2, f"{MARK}{what} {value}\n".encode())


class PeerWatch:
    """Heartbeats through jax.distributed's key-value store (see the module doc).

    client: jax's DistributedRuntimeClient (key_value_set, key_value_dir_get);
    on_lost(p): what to do when process p is lost (once, from the watch's thread)."""

    PREFIX = "replax/alive/"

    def __init__(
        self,
        client,
        process_id: int,
        num_processes: int,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 30.0,
        on_lost: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.client, self.process_id, self.num_processes = client, process_id, num_processes
        self.interval_s, self.timeout_s, self.clock = interval_s, timeout_s, clock
        self.on_lost = on_lost
        self.beats = 0
        now = clock()
        # Per peer: (its last counter seen, when it last changed); the store's last answer.
        self.seen = {p: (None, now) for p in range(num_processes) if p != process_id}
        self.reached = now
        self._stop = threading.Event()

    def beat(self) -> None:
        """One heartbeat: bump this process's counter and read everyone's."""
        self.beats += 1
        self.client.key_value_set(
            f"{self.PREFIX}{self.process_id}", str(self.beats), allow_overwrite=True
        )
        counters = dict(self.client.key_value_dir_get(self.PREFIX))
        now = self.clock()
        self.reached = now
        for p, (last, _) in self.seen.items():
            value = counters.get(f"{self.PREFIX}{p}")
            if value != last:
                self.seen[p] = (value, now)

    def lost(self) -> int | None:
        """The first process judged lost now, or None."""
        now = self.clock()
        if now - self.reached > self.timeout_s:
            return 0  # the store, which process 0 hosts, has not answered
        for p, (_, since) in sorted(self.seen.items()):
            if now - since > self.timeout_s:
                return p
        return None

    def start(self) -> PeerWatch:
        threading.Thread(target=self._beat_loop, name="replax-peer-beat", daemon=True).start()
        threading.Thread(target=self._judge_loop, name="replax-peer-judge", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception:  # noqa: BLE001 - an unreachable store is judged by its age
                pass

    def _judge_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            lost = self.lost()
            if lost is not None:
                self.on_lost(lost)
                return


def _leave(lost: int, num_processes: int, resume_step: Callable[[], int | None]) -> None:
    """Reports the loss (to the parent, or without one in the one line itself) and ends
    the process at once."""
    try:
        if os.environ.get(SUPERVISED):
            report("lost", lost)
        else:
            line = lost_line(lost, num_processes, _STEP[0], resume_step())
            os.write(2, f"{line}\n".encode())
        sys.stdout.flush()
    finally:
        os._exit(EXIT_PEER_LOST)


_WATCH: PeerWatch | None = None


def watch_peers(resume_step: Callable[[], int | None], timeout_s: float = 30.0) -> PeerWatch | None:
    """Starts this process's PeerWatch when jax.distributed runs several processes;
    resume_step: the step a rerun would resume from (for the line said without a
    supervising parent)."""
    global _WATCH
    from jax._src import distributed

    state = distributed.global_state
    if _WATCH is None and state.client is not None and state.num_processes > 1:
        n = state.num_processes
        _WATCH = PeerWatch(
            state.client,
            state.process_id,
            n,
            timeout_s=timeout_s,
            on_lost=lambda lost: _leave(lost, n, resume_step),
        ).start()
        report("processes", state.num_processes)
    return _WATCH


def stop_watching() -> None:
    """Stops the watch once the run is over: jax.distributed's shutdown at exit closes the
    store, which the watch would otherwise take for a lost process 0."""
    if _WATCH is not None:
        _WATCH.stop()


def await_loss() -> None:
    """After a collective failed: waits long enough for the watch to judge a lost peer
    (it ends the process then); returns when there is no watch or no peer was lost."""
    if _WATCH is not None:
        time.sleep(_WATCH.timeout_s + 5 * _WATCH.interval_s)
