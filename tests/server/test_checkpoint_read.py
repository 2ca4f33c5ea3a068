"""Reading a refresh's source (server/checkpoint_read.py): the staged weights are the process's own, whatever
happens to the file afterwards; a file cut short or with a hostile header is a one-line refusal; every NaN is
found, in every chunk; a rank's block is its own; and the swap serves the staged tensors without a copy."""

from __future__ import annotations

import json
import os
import struct
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from eagle3_target.server import checkpoint_read
from eagle3_target.server.checkpoint_read import ALIGN, CHUNK, HUGE, PIECE, Arena, read_file, read_header
from eagle3_target.server.errors import InvalidInput
from eagle3_target.server.runners.hf_weights import checkpoint_tensors, file_layout, swap_in
from eagle3_target.server.runners.tiny import build_tiny_llama
from eagle3_target.server.weight_source import read_source

BIG = CHUNK + 4099  # float32 elements: a tensor of several chunks, in huge-page memory


def saved(tmp_path, tensors: dict[str, torch.Tensor]):
    save_file(tensors, tmp_path / "model.safetensors")
    return tmp_path / "model.safetensors"


def read_one(path, name: str, block=None) -> torch.Tensor:
    return read_file(path, read_header(path, "src"), {name: block}, "src")[name]


def test_staged_weights_stay_as_read_when_the_file_is_rewritten_in_place_or_cut_short(tmp_path):
    a = {"big": torch.randn(BIG), "small": torch.randn(5, 3)}
    path = saved(tmp_path, a)
    staged = read_source(str(tmp_path), a, digest="")
    b = saved(tmp_path / "..", {k: v + 1 for k, v in a.items()}).read_bytes()
    with open(path, "r+b") as fh:  # a trainer saving its next checkpoint over the same file
        fh.write(b)
    assert all(torch.equal(staged[k], a[k]) for k in a)  # a mapped file would show B here
    os.truncate(path, 10)  # a mapped file would kill this process with SIGBUS here
    assert all(torch.equal(staged[k], a[k]) for k in a)


def test_a_file_cut_short_after_its_header_was_read_is_refused(tmp_path):
    path = saved(tmp_path, {"w": torch.randn(BIG)})
    header = read_header(path, "src")
    os.truncate(path, path.stat().st_size - 4 * 1000)
    with pytest.raises(InvalidInput) as refused:
        read_file(path, header, None, "src")
    assert refused.value.error == "source_corrupt"
    assert str(refused.value.detail) == "src: w: the file ends before this tensor does"


def header_file(tmp_path, header: bytes, length: int | None = None, data: bytes = b"\0" * 16):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


def entry(**spec) -> bytes:
    return json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16], **spec}}).encode()


HOSTILE = {
    "empty": (b"", 0),
    "no length": (b"\x01\x02", None),
    "zero length": (b"", 0),
    "longer than the file": (b"{}", 1 << 40),
    "not json": (b"\xff\xfe{", None),
    "a list": (b"[1, 2]", None),
    "nested deep": (b"[" * 100_000, None),
    "an entry not an object": (json.dumps({"w": 3}).encode(), None),
    "an unknown dtype": (entry(dtype="F4"), None),
    "a dtype that is a list": (entry(dtype=["F32"]), None),
    "a dtype of a megabyte": (entry(dtype="F" * (1 << 20)), None),
    "a negative dimension": (entry(shape=[-4]), None),
    "a boolean dimension": (entry(shape=[True, 4]), None),
    "three offsets": (entry(data_offsets=[0, 8, 16]), None),
    "bytes not the shape's": (entry(shape=[5]), None),
    "bytes past the end": (entry(shape=[8], data_offsets=[0, 32]), None),
    "offsets reversed": (entry(shape=[0], data_offsets=[16, 0]), None),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_header_is_a_one_line_refusal(tmp_path, case):
    header, length = HOSTILE[case]
    path = tmp_path / "model.safetensors"
    if case == "no length":
        path.write_bytes(header)
    else:
        header_file(tmp_path, header, length)
    with pytest.raises(InvalidInput) as refused:
        read_header(path, "src/model.safetensors")
    assert refused.value.error == "source_corrupt"
    assert refused.value.detail.startswith("src/model.safetensors: ") and "\n" not in refused.value.detail
    assert len(refused.value.detail) < 300


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200), length=st.one_of(st.none(), st.integers(0, 1 << 64 - 1)))
def test_any_header_bytes_are_read_or_refused_never_an_exception(tmp_path_factory, body, length):
    path = header_file(tmp_path_factory.mktemp("h"), body, length)
    try:
        read_header(path, "src")
    except InvalidInput as refused:
        assert refused.error == "source_corrupt"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_non_finite_value_is_found_in_whichever_chunk_it_lies(tmp_path, dtype):
    clean = torch.randn(BIG).to(dtype)
    assert torch.equal(read_one(saved(tmp_path, {"w": clean}), "w"), clean)
    per_chunk = CHUNK // clean.element_size()
    for at in (0, per_chunk - 1, per_chunk, 2 * per_chunk + 1, BIG - 1):
        bad = clean.clone()
        bad[at] = float("nan") if at % 2 else float("inf")
        with pytest.raises(InvalidInput, match="holds NaN or infinite values"):
            read_one(saved(tmp_path, {"w": bad}), "w")


def test_pieces_read_at_once_make_the_whole_and_the_first_refusal_in_file_order_is_raised(tmp_path):
    per_piece = PIECE // 4
    tensors = {"a": torch.randn(2 * per_piece + 3), "b": torch.randn(per_piece), "c": torch.randn(7)}
    path = saved(tmp_path, tensors)
    whole = read_file(path, read_header(path, "src"), None, "src")
    assert all(torch.equal(whole[k], v) for k, v in tensors.items())
    rows = torch.randn(3 * per_piece // 16 + 5, 16)  # a block of rows spanning several pieces
    block = (slice(per_piece // 16 - 1, rows.shape[0]), slice(0, 16))
    assert torch.equal(read_one(saved(tmp_path, {"w": rows}), "w", block), rows[block])
    tensors["a"][per_piece + 1] = tensors["c"][0] = float("nan")  # a's second piece, and c, later in the file
    path = saved(tmp_path, tensors)
    for _ in range(5):
        with pytest.raises(InvalidInput, match=r"^src: a: it holds NaN"):
            read_file(path, read_header(path, "src"), None, "src")
        assert not [t for t in threading.enumerate() if t.name.startswith("refresh-read")]  # none reads on


def test_after_a_refusal_the_pieces_not_yet_started_never_start(tmp_path, monkeypatch):
    bad = torch.randn(1 << 20)
    bad[0] = float("nan")
    path = saved(tmp_path, {"w": bad})
    monkeypatch.setattr(checkpoint_read, "PIECE", 16 << 10)  # 256 pieces
    monkeypatch.setattr(checkpoint_read, "READERS", 1)  # the reader that refuses is the one that would go on
    started = []
    read_into = checkpoint_read.read_into
    monkeypatch.setattr(checkpoint_read, "read_into", lambda *args: started.append(1) or read_into(*args))
    with pytest.raises(InvalidInput, match="NaN"):
        read_file(path, read_header(path, "src"), None, "src")
    assert len(started) == 1


def test_a_block_is_read_and_checked_as_its_rank_holds_it(tmp_path):
    whole = torch.randn(6, 8)
    whole[:, 4:] = float("nan")  # only in the columns another rank holds
    path = saved(tmp_path, {"w": whole})
    left = read_one(path, "w", (slice(0, 6), slice(0, 4)))
    assert torch.equal(left, whole[:, :4]) and left.is_contiguous()
    with pytest.raises(InvalidInput, match="NaN"):
        read_one(path, "w", (slice(0, 6), slice(4, 8)))
    rows = torch.randn(6, 8)
    assert torch.equal(read_one(saved(tmp_path, {"w": rows}), "w", (slice(2, 5), slice(0, 8))), rows[2:5])


def test_a_files_tensors_are_carved_from_one_arena_that_begins_on_a_huge_page(tmp_path):
    tensors = {
        "a": torch.randn(BIG),
        "b": torch.randn(3),
        "c": torch.arange(5),
        "d": torch.randn(2, 7).half(),
    }
    saved(tmp_path, tensors)
    staged = read_source(str(tmp_path), tensors, digest="")
    assert all(torch.equal(staged[k], v) for k, v in tensors.items())
    storages = {t.untyped_storage().data_ptr() for t in staged.values()}
    assert len(storages) == 1  # one mapping, whose first tensor begins on a huge page's boundary
    assert min(t.data_ptr() for t in staged.values()) % HUGE == 0
    assert all(t.data_ptr() % ALIGN == 0 and t.is_contiguous() for t in staged.values())
    arena = Arena(Arena.size([((3,), torch.float32)]))
    arena.take((3,), torch.float32)
    with pytest.raises(ValueError, match="no room"):
        arena.take((1,), torch.uint8)


def test_the_swap_serves_the_staged_tensors_themselves_and_copies_across_dtypes(tmp_path):
    model = build_tiny_llama(seed=1)
    new = {name: torch.randn_like(t) for name, t in checkpoint_tensors(model).items()}
    swap_in(model, new)
    served = dict(model.state_dict())
    assert all(served[n].data_ptr() == t.data_ptr() for n, t in new.items())  # no copy
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in model.parameters())
    halved = build_tiny_llama(seed=1).to(torch.bfloat16)
    swap_in(halved, new)  # another dtype (or device) is copied in, in the served dtype
    for name, tensor in checkpoint_tensors(halved).items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, new[name].to(torch.bfloat16))


def test_a_served_checkpoint_in_a_dtype_this_server_cannot_stage_offers_no_refresh(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    header_file(
        served, json.dumps({"w": {"dtype": "F4", "shape": [2, 16], "data_offsets": [0, 16]}}).encode()
    )
    with pytest.raises(InvalidInput) as refused:
        file_layout(str(served), "vllm")
    assert refused.value.error == "refresh_not_offered"
    assert (
        refused.value.detail
        == f"the vllm engine cannot refresh {served}/model.safetensors: tensor 'w' has no dtype this server reads: 'F4'"
    )
