"""The heartbeat names the peer a failed collective waited for — including one that is
still dying when the collective notices (its sockets close before it reads as dead)."""

import json
import socket
import subprocess
import threading
import time

import torch.distributed as dist

from paracube.heartbeat import Heartbeat


def _record(store, rank: int, pid: int, step: int) -> None:
    store.set(
        f"paracube/heartbeat/{rank}",
        json.dumps(
            {
                "step": step,
                "phase": "backward",
                "pid": pid,
                "host": socket.gethostname(),
                "time": time.time(),
            }
        ),
    )


def test_a_peer_that_dies_while_we_look_is_named():
    store = dist.HashStore()
    me = Heartbeat(store, rank=0, world=2)
    try:
        me.at(5, "backward")
        peer = subprocess.Popen(["sleep", "60"])
        _record(store, 1, peer.pid, step=5)
        assert me.laggards(settle=0) == []  # alive, same step: nobody to name yet
        threading.Timer(0.2, peer.kill).start()
        named = me.laggards(settle=2.0)
        assert [(p.rank, p.state()) for p in named] == [(1, "dead")]
        peer.wait()
    finally:
        me.close()


def test_a_live_peer_behind_is_named_after_the_settle():
    store = dist.HashStore()
    me = Heartbeat(store, rank=0, world=3)
    try:
        me.at(7, "forward")
        peers = [subprocess.Popen(["sleep", "60"]) for _ in range(2)]
        _record(store, 1, peers[0].pid, step=7)
        _record(store, 2, peers[1].pid, step=6)
        named = me.laggards(settle=0.2)
        assert [(p.rank, p.step, p.state()) for p in named] == [(2, 6, "running")]
    finally:
        me.close()
        for p in peers:
            p.kill()
            p.wait()
