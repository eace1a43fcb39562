"""How rank 0's calls reach the other ranks: the ranks of rank 0's node read them from a ring in shared
memory (distributed/shm_broadcast.py), the ranks of other nodes get them over a gloo group (the one
torch.distributed connected at start-up: no other port to open, and its connection breaking is how a
worker node learns that the head has gone)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from wick.config import ParallelConfig
from wick.distributed.parallel_state import control_group, remote_group
from wick.distributed.shm_broadcast import ShmBroadcast


class StepChannel:
    """Rank 0's end sends, every other rank's end receives. Connecting is collective over the control group."""

    def __init__(self, rank: int, parallel: ParallelConfig) -> None:
        self.rank = rank
        local = parallel.ranks_per_node
        self.ring = ShmBroadcast.create(local - 1) if rank == 0 and local > 1 else None
        try:
            handle = [None if self.ring is None else self.ring.handle]
            dist.broadcast_object_list(handle, src=0, group=control_group())
            if 0 < rank < local:
                self.ring = ShmBroadcast.attach(handle[0], rank - 1)
            dist.barrier(group=control_group())
        except BaseException:
            self.close()  # the writer's close removes the ring's file
            raise
        if rank == 0 and self.ring is not None:
            self.ring.unlink()  # every reader has it mapped
        self.remote = remote_group() if rank == 0 or rank >= local else None

    def send(self, message: Any) -> None:
        """Rank 0: `message` to every other rank."""
        if self.ring is not None:
            self.ring.send(message)
        if self.remote is not None:
            dist.broadcast_object_list([message], src=0, group=self.remote)

    def recv(self) -> Any:
        """Another rank: rank 0's next message."""
        if self.ring is not None:
            return self.ring.recv()
        message = [None]
        dist.broadcast_object_list(message, src=0, group=self.remote)
        return message[0]

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
