"""Adapter files are read as safetensors only, bounded by their own header: a pickle or zip under any name, a
header that is too long, not JSON or whose ranges do not tile the data, a file longer or shorter than its
header says, and an endless stream are each refused with the URL, the reason and the fix, never a byte of the
file; a good file reads the same from disk and over http, with its sha256."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
from safetensors.torch import save, save_file

from genbatch.io.adapter_file import AdapterError, read_adapter
from genbatch.io.media_policy import MediaPolicy
from genbatch.jobs.lora import parse_lora, pickle_problem
from tests.support.media_server import MediaServer

SECRET = b"ADAPTER-SECRET"


def _file(tmp_path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def _header_file(tmp_path, header: dict, data: bytes = b"") -> str:
    raw = json.dumps(header).encode()
    return _file(tmp_path, "adapter.safetensors", struct.pack("<Q", len(raw)) + raw + data)


def test_a_header_whose_length_starts_like_a_pickle_still_reads(tmp_path):
    for length in (0x280, 0x380, 0x480, 0x580):  # little-endian: b"\x80\x02" .. b"\x80\x05" first
        header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
        path = _file(tmp_path, f"{length}.safetensors",
                     struct.pack("<Q", length) + header.ljust(length) + b"\0" * 4)  # safetensors pads with spaces
        assert read_adapter(path, policy=None).tensors["w"].shape == (1,)


def test_a_good_file_reads_with_its_sha256_and_metadata(tmp_path):
    tensors = {"a.lora_A.weight": torch.randn(2, 3), "a.lora_B.weight": torch.randn(4, 2)}
    path = str(tmp_path / "good.safetensors")
    save_file(tensors, path, metadata={"lora_adapter_metadata": "{}"})
    adapter = read_adapter(path, policy=MediaPolicy(allow=(str(tmp_path),)))
    assert adapter.sha256 == hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert adapter.metadata == {"lora_adapter_metadata": "{}"}
    for name, value in tensors.items():
        torch.testing.assert_close(adapter.tensors[name], value, rtol=0, atol=0)


@pytest.mark.parametrize(("data", "reason"), [
    (b"\x80\x04" + SECRET * 4, "looks like a pickle or zip archive"),
    (b"PK\x03\x04" + SECRET * 4, "looks like a pickle or zip archive"),
    (struct.pack("<Q", 1 << 40) + SECRET, "a header of 1099511627776 bytes"),
    (struct.pack("<Q", 5) + b"{nope" + SECRET, "its header is not JSON"),
    (b"abc", "3 bytes is not a safetensors file"),
])
def test_what_is_not_safetensors_is_refused_by_its_first_bytes(tmp_path, data, reason):
    path = _file(tmp_path, "named.safetensors", data)
    with pytest.raises(AdapterError, match=reason) as error:
        read_adapter(path, policy=None)
    assert SECRET.decode() not in str(error.value) and path in str(error.value)


def test_a_pickle_file_name_is_refused_with_the_fix():
    assert "convert it to safetensors" in pickle_problem("s3://bucket/style.bin")
    assert pickle_problem("lora.PT") and pickle_problem("x/model.ckpt") and not pickle_problem("a.safetensors")
    with pytest.raises(ValueError, match="adapter 0: evil.pt is a pickle file"):
        parse_lora([{"uri": "evil.pt"}], "/data")
    with pytest.raises(ValueError, match="adapter 1 .* has scale"):
        parse_lora([{"uri": "org/name"}, {"uri": "./a.safetensors", "scale": float("nan")}], "/data")
    hub, local = parse_lora([{"uri": "org/name@v2"}, {"uri": "./loras/dir"}], "/data")
    assert (hub.uri, hub.is_hub_id, local.uri, local.is_hub_id) == ("org/name@v2", True, "/data/loras/dir", False)


def test_the_header_must_match_the_shapes_and_the_data(tmp_path):
    entry = {"dtype": "F32", "shape": [2, 2]}
    cases = [
        ({"t": {**entry, "data_offsets": [0, 12]}}, b"\0" * 12, "declares 16 bytes .* but spans 12"),
        ({"t": {**entry, "data_offsets": [0, 16]}, "u": {**entry, "data_offsets": [32, 48]}}, b"\0" * 48,
         "overlap or leave gaps"),
        ({"t": {**entry, "data_offsets": [0, 16]}}, b"\0" * 16 + SECRET, r"is \d+ bytes, but its header declares \d+; copy it again"),
        ({"t": {**entry, "data_offsets": [0, 16]}}, b"\0" * 8, r"is \d+ bytes, but its header declares \d+; copy it again"),
        ({"t": {"dtype": "F32", "shape": [1 << 20, 1 << 15], "data_offsets": [0, 1 << 37]}}, b"", "128.0 GiB"),
    ]
    for header, data, reason in cases:
        path = _header_file(tmp_path, header, data)
        with pytest.raises(AdapterError, match=reason) as error:
            read_adapter(path, policy=None)
        assert SECRET.decode() not in str(error.value)


def test_over_http_the_header_bounds_the_read_and_an_endless_stream_costs_eight_bytes(tmp_path):
    good = save({"x.lora_A.weight": torch.ones(2, 2)})
    with MediaServer("127.0.0.1", {"/good.safetensors": good}, stream={"/endless.safetensors": 64 << 20}) as server:
        policy = MediaPolicy(allow=(server.root,))
        adapter = read_adapter(server.url("/good.safetensors"), policy=policy, timeout_s=10)
        assert adapter.sha256 == hashlib.sha256(good).hexdigest()
        with pytest.raises(AdapterError, match="a header of 0 bytes"):
            read_adapter(server.url("/endless.safetensors"), policy=policy, timeout_s=10)
        with pytest.raises(AdapterError, match="outside the allowed media prefixes"):
            read_adapter(server.url("/good.safetensors"), policy=MediaPolicy(allow=("http://127.0.0.1:1/",)))
