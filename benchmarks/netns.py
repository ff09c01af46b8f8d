"""Two ranks on a real, slow link: network namespaces joined by a veth pair shaped by tc.

Each rank runs in its own network namespace (``pc-rank0``, ``pc-rank1``) with one end of
a veth pair (10.77.0.1/24, 10.77.0.2/24); ``tc`` (a token-bucket filter) limits what each end sends,
so every byte of a collective crosses a link of the given rate — the kernel's TCP, not a
sleep. Created on entry and removed on exit (also on error). Needs root (``ip netns``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

NAMESPACES = ("pc-rank0", "pc-rank1")
DEVICES = ("pc-veth0", "pc-veth1")
ADDRESSES = ("10.77.0.1", "10.77.0.2")


def available() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    return f"needs {' and '.join(missing)} (iproute2)" if missing else None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _remove() -> None:
    for ns in NAMESPACES:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextlib.contextmanager
def namespaces() -> Iterator[None]:
    """The two namespaces and the veth pair between them, unshaped."""
    _remove()  # a previous run that was killed
    try:
        for ns in NAMESPACES:
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", DEVICES[0], "netns", NAMESPACES[0], "type", "veth",
            "peer", "name", DEVICES[1], "netns", NAMESPACES[1])  # fmt: skip
        for ns, dev, addr in zip(NAMESPACES, DEVICES, ADDRESSES):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        yield
    finally:
        _remove()


def shape(rate_mbit: float | None) -> None:
    """Limit both directions of the link to ``rate_mbit`` Mbit/s (None: unshaped)."""
    for ns, dev in zip(NAMESPACES, DEVICES):
        subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True)
        if rate_mbit is not None:
            # a token bucket (tbf: in every kernel, where netem may be a missing module);
            # its queue holds half a second of traffic, so TCP sees a rate, not drops
            subprocess.run(
                ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                 "rate", f"{rate_mbit:g}mbit", "burst", "256kb", "latency", "500ms"],
                check=True, capture_output=True,
            )  # fmt: skip


def in_namespace(rank: int, argv: list[str]) -> list[str]:
    """The command line that runs ``argv`` as ``rank`` inside its namespace."""
    return ["ip", "netns", "exec", NAMESPACES[rank], *argv]


def rank_env(rank: int, port: int) -> dict[str, str]:
    """torch.distributed's environment for ``rank`` of 2, meeting at rank 0's address,
    gloo bound to the veth end."""
    return {
        **os.environ,
        "MASTER_ADDR": ADDRESSES[0],
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "GLOO_SOCKET_IFNAME": DEVICES[rank],
        "OMP_NUM_THREADS": "1",
    }
