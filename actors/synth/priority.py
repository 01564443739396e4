"""The actor's helper threads (one per block in flight, the finisher) below the engine loop's
thread in the CPU's queue, when the engine runs on the CPU.

There the engine thread is what the node is for, and the helpers' work (rows to specs, Arrow
tables, handing audio to the codec's child and back) waits at no cost while the engine has a
core: a helper that wakes mid-step no longer takes the engine's core for a time slice. Measured
on the demo, 1 actor x 16 slots, 160 rows, 2-vCPU Sapphire Rapids, six interleaved rounds:
`vs_engine_only` median 0.868 with the helpers at 19 against 0.849 at the actor's own 15, slot
occupancy 0.95-0.97 either way (the helpers still keep the slots fed). On a GPU the engine
thread mostly waits on the device and the host work decides the pace: nothing changes there.
Linux only: elsewhere a thread's priority is its process's.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module

# the lowest a thread can ask for without privileges; Ray starts its workers at 15
# (RAY_worker_niceness), the engine thread keeps that
HELPER_NICENESS = 19


def yield_to_engine(engine_device: str) -> None:
    """Called first in a helper thread: the calling thread (only it) at HELPER_NICENESS when
    the engine is on the CPU under Linux; otherwise nothing."""
    if not engine_device.startswith("cpu") or not sys.platform.startswith("linux"):
        return
    try:
        # on Linux a thread's id names that thread alone for PRIO_PROCESS
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HELPER_NICENESS)
    except OSError as e:  # a sandbox that forbids it: the run goes on at the actor's priority
        log.warning("could not lower %s's priority: %s", threading.current_thread().name, e)
