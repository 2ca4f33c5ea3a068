"""The rendezvous of a split replica's ranks (server/ranks.py): a replica whose other ranks never join fails
with the reason instead of waiting forever."""

import datetime

import pytest
import torch.distributed as dist

from eagle3_target.server.ranks import wait_for_ranks


def test_a_replica_whose_other_node_never_starts_fails_with_the_reason():
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    store.add("joined", 1)
    with pytest.raises(RuntimeError, match=r"only 1 of the replica's 2 ranks joined in 1s: start every node"):
        wait_for_ranks(store, 2, timeout=1.0)
    store.add("joined", 1)
    wait_for_ranks(store, 2, timeout=1.0)  # both joined: returns at once


def test_the_store_answers_across_clients():
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=datetime.timedelta(seconds=5))
    client.add("joined", 2)
    wait_for_ranks(store, 2, timeout=1.0)
