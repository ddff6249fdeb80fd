"""What a row's URL may make a rank read (`genbatch.io.media_policy`, `genbatch.io.http_read`): the address rule
as a pure function, the allowed prefixes after `..` and symlinks, the size bound, and http(s) reads whose every
redirect is judged again, on loopback servers only. No refusal shows a byte of the file it refused."""

from __future__ import annotations

import io
import os

import pytest
from PIL import Image

from genbatch.io.http_read import read_http
from genbatch.io.media_input import MediaError, MediaReader
from genbatch.io.media_policy import (
    MediaPolicy,
    MediaRefused,
    canonical_url,
    default_media_allow,
    parse_networks,
    refused_address,
)
from tests.support.media_server import MediaServer

SECRET = b"SECRET-do-not-show-0451"


def _png(size=(8, 8), colour=(10, 20, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("address, refused", [
    ("169.254.169.254", True), ("169.254.0.1", True), ("169.254.255.255", True), ("169.253.255.255", False),
    ("fd00:ec2::254", True), ("[fd00:ec2::254]", True), ("fd00:ec2::253", False), ("fe80::1", True),
    ("fe80::1%eth0", True), ("::ffff:169.254.169.254", True), ("metadata.google.internal", True),
    ("METADATA.GOOGLE.INTERNAL.", True), ("metadata.goog", True), ("8.8.8.8", False), ("127.0.0.1", False),
    ("example.com", False), ("10.0.0.1", False),
])
def test_the_address_rule_is_a_pure_function_of_the_address(address, refused):
    assert refused_address(address) is refused


def test_refused_networks_extend_the_rule_and_bad_ones_name_the_flag():
    extra = parse_networks(["127.0.0.2", "10.0.0.0/8"])
    assert refused_address("127.0.0.2", extra) and refused_address("10.9.8.7", extra)
    assert not refused_address("127.0.0.1", extra) and refused_address("169.254.169.254", extra)
    with pytest.raises(ValueError, match=r"--media-refuse 'ten\.0' is not an address or network"):
        parse_networks(["ten.0"])


def test_prefixes_match_whole_segments_after_dot_dot_and_symlinks(tmp_path):
    allowed = tmp_path / "batch"
    (allowed / "img").mkdir(parents=True)
    (tmp_path / "batchmates").mkdir()
    os.symlink(tmp_path, allowed / "img" / "escape")  # a link inside that points outside
    os.symlink(allowed / "img", tmp_path / "door")  # a link outside that points inside
    policy = MediaPolicy.for_manifest(str(allowed / "manifest.parquet"))
    assert policy.outside(str(allowed / "img" / "a.png")) is None
    assert policy.outside(str(tmp_path / "door" / "a.png")) is None  # what it resolves to is inside
    for outside in (str(tmp_path / "secret.txt"), str(allowed / ".." / "secret.txt"),
                    str(allowed / "img" / "escape" / "secret.txt"), str(tmp_path / "batchmates" / "a.png"),
                    "/etc/shadow", "~/.aws/credentials"):
        reason = policy.outside(outside)
        assert reason is not None and "outside the allowed media prefixes" in reason
        assert "--media-allow" in reason and str(allowed) in reason
    assert f"resolves to {tmp_path / 'secret.txt'}" in policy.outside(str(allowed / "img" / "escape" / "secret.txt"))


def test_media_allow_admits_exactly_the_prefixes_it_names(tmp_path):
    policy = MediaPolicy.for_manifest("s3://team/batch/manifest.parquet",
                                      allow=("s3://art/2026", "https://CDN.example.com/frames", str(tmp_path)))
    assert policy.allow[:2] == ("s3://team/batch", default_media_allow("s3://team/batch/m.parquet")[1])
    for inside in ("s3://team/batch/a.png", "s3://team/batch/sub/b.png", "s3://art/2026/c.png",
                   "https://cdn.example.com/frames/d.png", str(tmp_path / "e.png")):
        assert policy.outside(inside) is None, inside
    for outside in ("s3://team/batchx/a.png", "s3://team/a.png", "s3://team/batch/../a.png", "s3://art/2025/c.png",
                    "s3://art/2026x/c.png", "https://cdn.example.com/framesets/d.png", "http://evil.example/x",
                    "https://cdn.example.com.evil/frames/d.png", str(tmp_path) + "-other/e.png", "gs://team/batch/a"):
        assert policy.outside(outside) is not None, outside
    assert canonical_url("s3://b/p/../q/./r.png") == "s3://b/q/r.png"
    assert canonical_url("HTTPS://Host.Example/a/../b") == "https://host.example/b"


def test_the_default_admits_the_manifests_own_folder_and_the_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    policy = MediaPolicy.for_manifest(str(tmp_path / "runs" / "m.parquet"))
    assert policy.allow == (str(tmp_path / "runs"), str(tmp_path / "hub"))
    assert policy.outside(str(tmp_path / "hub" / "models--a--b" / "x.safetensors")) is None


def test_the_reader_refuses_before_reading_and_bounds_what_it_reads(tmp_path):
    (tmp_path / "batch").mkdir()
    good = tmp_path / "batch" / "good.png"
    good.write_bytes(_png())
    big = tmp_path / "batch" / "big.png"
    big.write_bytes(_png((64, 64)) + SECRET * 100)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(SECRET)
    policy = MediaPolicy.for_manifest(str(tmp_path / "batch" / "m.parquet"), max_mib=2048 / 2**20)
    reader = MediaReader(policy=policy)
    assert reader.read("image", str(good)).image.size == (8, 8)
    for url, reason in ((str(secret), "outside the allowed media prefixes"),
                        (str(tmp_path / "batch" / ".." / "secret.txt"), "outside the allowed media prefixes"),
                        (str(big), "MiB, over the 0.00195312 MiB a row's input may have")):
        with pytest.raises(MediaError) as caught:
            reader.read("image", url)
        message = str(caught.value)
        assert f"column 'image': {url}: " in message and reason in message and SECRET.decode() not in message


def test_http_reads_check_every_redirect_and_never_touch_a_refused_address():
    image = _png()
    with MediaServer("127.0.0.2", {"/secret.png": SECRET}) as inner, \
            MediaServer("127.0.0.1", {"/a.png": image, "/big.png": image + SECRET * 4096},
                        redirects={"/hop": "/a.png", "/to-inner": inner.url("/secret.png"),
                                   "/loop": "/loop", "/to-elsewhere": "http://127.0.0.3:9/x.png"},
                        stream={"/endless": 8 << 20}) as outer:
        policy = MediaPolicy(allow=(outer.root, inner.root), max_bytes=64 << 10, refuse=parse_networks(["127.0.0.2"]))
        assert read_http(outer.url("/a.png"), policy, timeout_s=5) == image
        assert read_http(outer.url("/hop"), policy, timeout_s=5) == image  # a redirect inside the rules is followed
        with pytest.raises(MediaRefused, match=r"redirected to http://127\.0\.0\.2:\d+/secret\.png\): 127\.0\.0\.2 is "
                                               r"a refused address"):
            read_http(outer.url("/to-inner"), policy, timeout_s=5)
        with pytest.raises(MediaRefused, match=r"redirected to http://127\.0\.0\.3:9/x\.png\): outside the allowed"):
            read_http(outer.url("/to-elsewhere"), policy, timeout_s=5)
        with pytest.raises(MediaRefused, match="MiB, over the 0.0625 MiB"):  # its Content-Length says so
            read_http(outer.url("/big.png"), policy, timeout_s=5)
        with pytest.raises(MediaRefused, match="sends more than the 0.0625 MiB"):  # no length: cut off at the bound
            read_http(outer.url("/endless"), policy, timeout_s=5)
        with pytest.raises(OSError, match="more than 5 redirects"):
            read_http(outer.url("/loop"), policy, timeout_s=5)
        with pytest.raises(FileNotFoundError):
            read_http(outer.url("/none.png"), policy, timeout_s=5)
        assert inner.requests == []  # the refused address never saw a request
        reader = MediaReader(policy=policy)
        with pytest.raises(MediaError) as caught:
            reader.read("image", outer.url("/to-inner"))
        assert SECRET.decode() not in str(caught.value)
        with pytest.raises(MediaError, match="no such file"):
            reader.read("image", outer.url("/none.png"))
        assert reader.read("image", outer.url("/hop")).image.size == (8, 8)
        assert inner.requests == []
