"""What a process uses, read from ``/proc`` (Linux): the figures of the soak test.

A long-running server that leaks shows it in its resident memory and its open file descriptors
(sockets it never closes); its CPU time says how busy it was in between. All three are read from
outside, so the process measured runs exactly as in production.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Usage", "alive", "children", "tcp_connections", "usage"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Usage:
    rss_kib: int
    """Resident set size (``VmRSS``)."""
    fds: int
    """Open file descriptors (entries of ``/proc/<pid>/fd``)."""
    cpu_seconds: float
    """User plus system CPU time so far."""

    @property
    def rss_mib(self) -> float:
        return self.rss_kib / 1024


def usage(pid: int) -> Usage:
    """The current usage of process ``pid`` (raises OSError when it is gone)."""
    proc = Path("/proc") / str(pid)
    rss = next(
        int(line.split()[1])
        for line in (proc / "status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    fds = len(os.listdir(proc / "fd"))
    # /proc/<pid>/stat: the command name (field 2) is in parentheses and may hold spaces;
    # utime and stime are fields 14 and 15, counted in clock ticks.
    fields = (proc / "stat").read_text().rpartition(")")[2].split()
    cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return Usage(rss_kib=rss, fds=fds, cpu_seconds=cpu)


_ESTABLISHED = "01"


def tcp_connections(pid: int, *, port: int) -> int:
    """Established TCP connections of process ``pid`` to remote ``port`` (any address), e.g.
    how many connections a server holds open to its upstream."""
    proc = Path("/proc") / str(pid)
    inodes = set()
    for fd in os.listdir(proc / "fd"):
        try:
            target = os.readlink(proc / "fd" / fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("tcp", "tcp6"):
        path = proc / "net" / table
        if not path.exists():
            continue
        # columns: sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rpartition(":")[2], 16)
            if remote_port == port and fields[3] == _ESTABLISHED and fields[9] in inodes:
                count += 1
    return count


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` now (read from every ``/proc/<pid>/stat``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # the field after the parenthesised command name: state, then the parent's pid
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        fields = (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()
    except OSError:
        return False
    return fields[0] != "Z"
