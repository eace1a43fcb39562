"""Looking for processes through /proc: whether one runs, which have an argument, a process's descendants."""

from __future__ import annotations

from pathlib import Path


def process_exists(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def pids_with_argument(argument: str) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argument.encode() in cmdline and process_exists(int(entry.name)):
                pids.add(int(entry.name))
    return pids


def descendants(pid: int) -> set[int]:
    found, stack = set(), [pid]
    while stack:
        parent = stack.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                stack.extend(int(child) for child in children.read_text().split())
            except OSError:
                continue
        found.add(parent)
    return found - {pid}
