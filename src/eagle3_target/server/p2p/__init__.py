"""The point-to-point ("p2p") path: supervision tensors sent over a two-rank torch.distributed group
(gloo or NCCL) per client session instead of the HTTP body. NeMo calls it NCCL (/init_nccl,
X-NeMo-NCCL); those wire names stay, everything of ours says p2p.

options: P2POptions and its flags (no torch: `serve --help` reads them); group: one session's group
and one transfer over it; groups: P2PGroups, every session's group, /init_nccl and teardown.
"""
