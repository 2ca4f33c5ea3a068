"""A rank process started by a node's `serve` (ranks.py): join the replica, load the same model and follow
rank 0 until the replica ends. Which engine's follower runs is the engine table's ``rank`` entry."""

from __future__ import annotations

import json
import logging
import sys

from eagle3_target.protocol.engine_spec import entry
from eagle3_target.protocol.engines import engine

from .lifeline import exit_with_parent
from .ranks import RankSpec, join_rank


def main(argv: list[str]) -> int:
    """argv: the rank's RankSpec as JSON, and the pid of the `serve` that started it."""
    exit_with_parent(int(argv[1]))  # from the start: joining may wait minutes for ranks that never come
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = RankSpec(**json.loads(argv[0]))
    follow_group = entry(engine(spec.options["engine"]).rank)
    group = join_rank(spec, [], None, spec.options.get("device", "cpu"))
    follow_group(group, spec.options)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
