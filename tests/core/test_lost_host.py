"""replax.core.lost_host: the heartbeat watch's judgement on a fake store and clock, the
relay's one line, and the supervising fork with a child that fails as a lost peer makes
it fail (the end-to-end runs are in tests/scripts/test_multihost.py)."""

import io
import os
import subprocess
import sys
import textwrap

import pytest

from replax.core import lost_host

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class FakeStore:
    """jax's key-value client, in memory; `down` makes every call fail."""

    def __init__(self):
        self.values, self.down = {}, False

    def key_value_set(self, key, value, allow_overwrite=False):
        if self.down:
            raise RuntimeError("UNAVAILABLE")
        self.values[key] = value

    def key_value_dir_get(self, prefix):
        if self.down:
            raise RuntimeError("UNAVAILABLE")
        return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]


def _watches(store, clock):
    return [
        lost_host.PeerWatch(store, p, 3, timeout_s=30, on_lost=print, clock=clock) for p in range(3)
    ]


def test_a_peer_whose_counter_stops_is_lost_after_the_timeout():
    now = [0.0]
    store = FakeStore()
    watches = _watches(store, lambda: now[0])
    # Each tick the watches beat in turn; process 2 stops after its beat at t = 10, which
    # the others read at t = 11 (they beat before it at t = 10): lost after t = 11 + 30.
    for t in range(1, 43):
        now[0] = t
        for w in watches[: 3 if t <= 10 else 2]:
            w.beat()
        assert watches[0].lost() == (2 if t > 41 else None), t
    assert watches[1].lost() == 2


def test_an_unreachable_store_is_process_zero_lost():
    now = [0.0]
    store = FakeStore()
    watch = _watches(store, lambda: now[0])[1]
    store.down = True  # from the start: never reached
    now[0] = 30
    assert watch.lost() is None
    now[0] = 31
    with pytest.raises(RuntimeError):
        watch.beat()
    assert watch.lost() == 0


def test_relay_passes_lines_and_turns_an_abort_for_a_lost_leader_into_one_line():
    out = io.StringIO()
    relay = lost_host.Relay(out)
    for line in [
        f"{lost_host.MARK}processes 2\n",
        "step 1/4 reward 0.4\n",
        f"{lost_host.MARK}step 3\n",
        "W1204 18:25:07.700633 13778 preemption_sync_manager.cc:147] Failed to retrieve "
        "preemption notice from coordination service: UNAVAILABLE\n",
        "Additional GRPC error information\n",
        "Traceback (most recent call last):\n",
        '  File "x.py", line 1\n',
        "F1204 18:11:48.594585 1833 client.h:80] Terminating process ... Failed to send RPC "
        "to coordination service. Either the leader task was preempted/died\n",
        "*** Check failure stack trace: ***\n",
    ]:
        relay.feed(line)
    assert out.getvalue() == "step 1/4 reward 0.4\n"  # the rest is held back
    assert relay.finish(134, lambda: 2) == lost_host.EXIT_PEER_LOST
    assert out.getvalue().splitlines()[1:] == [
        "replax: process 0 of 2 was lost at step 3; run the same command on every process "
        "to resume from step 2"
    ]


def test_relay_names_the_task_jax_found_unhealthy_and_relays_other_failures():
    out = io.StringIO()
    relay = lost_host.Relay(out)
    relay.feed(
        "F1204 client.h:80] ... The following tasks are unhealthy (stopped sending heartbeats):\n"
    )
    relay.feed("1\n")
    assert relay.lost_process() == 1
    assert relay.finish(134, lambda: None) == lost_host.EXIT_PEER_LOST
    assert out.getvalue().endswith(
        "was lost; run the same command on every process to start again from step 0\n"
    )

    out = io.StringIO()
    relay = lost_host.Relay(out)
    lines = ["W1204 12:00:00.1 1 other.cc:1] a warning\n", "step 2/4\n"]
    lines += ["Traceback (most recent call last):\n", "ValueError: a bug\n"]
    for line in lines:
        relay.feed(line)
    assert out.getvalue() == "".join(lines[:2])  # passed on as they came
    assert relay.finish(1, lambda: 2) == 1
    assert out.getvalue() == "".join(lines)


# A supervised child that reports its step, then dies as jax's client makes it die when
# process 0 is gone (an absl fatal line and abort), or (argv "bug") raises.
_CHILD = textwrap.dedent(
    """
    import os, sys
    from replax.core import lost_host
    lost_host.supervise(lambda: 2)
    print("child", flush=True)
    lost_host.report("processes", 2)
    lost_host.report("step", 3)
    sys.stderr.write("step 3/4\\n")
    sys.stderr.flush()
    if sys.argv[1] == "bug":
        raise ValueError("a bug")
    os.write(2, b"F1204 client.h:80] Failed to send RPC to coordination service\\n")
    os.abort()
    """
)


@pytest.mark.parametrize("how", ["abort", "bug"])
def test_supervise_relays_the_child_and_says_one_line_for_a_lost_peer(how):
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, how],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout == "child\n"
    lines = proc.stderr.splitlines()
    assert lines[0] == "step 3/4"
    if how == "abort":
        assert proc.returncode == lost_host.EXIT_PEER_LOST
        assert lines[1:] == [
            "replax: process 0 of 2 was lost at step 3; run the same command on every "
            "process to resume from step 2"
        ]
    else:
        assert proc.returncode == 1
        assert lines[1] == "Traceback (most recent call last):" and lines[-1] == "ValueError: a bug"
