"""How one replica is split: tensor and pipeline parallel sizes, and the nodes its ranks run on.

The seam every engine shares: `serve` parses the flags into a ``ParallelLayout`` once, each runner
says which layouts it can honour, and node-rank 0 is the only process that serves the model's
endpoints. A layout of one device is the default and changes nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ParallelLayout:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def single(self) -> bool:
        """One process on one device: the path every engine had before layouts."""
        return self.world_size == 1 and self.nnodes == 1

    @property
    def leader(self) -> bool:
        """Node-rank 0 serves the model endpoints; the other nodes follow its forwards."""
        return self.node_rank == 0

    def describe(self) -> dict:
        """What /model_info reports of the layout (addresses and ports are per-server, not the model's)."""
        return {k: v for k, v in asdict(self).items() if k not in ("master_addr", "master_port", "node_rank")}

    @classmethod
    def from_args(cls, args) -> ParallelLayout:
        return cls(
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            master_addr=args.master_addr,
            master_port=args.master_port,
        )


ONE_DEVICE = ParallelLayout()  # the default layout: one process on one device
