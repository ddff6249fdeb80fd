"""`gen run` and `gen validate` on a manifest whose rows point where they should not: a file outside the manifest's
folder (by absolute path, by `..`, by a symlink), an image over `--media-max-mib`, and an allowed URL that
redirects to a refused address. Each such row is rejected (or, found only when read, fails) alone, the good rows
run, and no byte of those files appears in any output, log line or results column; `--media-allow` admits
exactly what it names."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pyarrow.parquet as pq
from PIL import Image, PngImagePlugin

from tests.support.media_server import MediaServer
from tests.support.runs import run_cli, write_manifest

SECRET = "SECRET-do-not-show-7788"
MODEL = "tiny-flux-kontext"


def _png(size, noisy: bool) -> bytes:
    pixels = (np.random.default_rng(3).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8) if noisy
              else np.full((size[1], size[0], 3), 90, np.uint8))
    info = PngImagePlugin.PngInfo()
    info.add_text("note", SECRET)  # the bytes no message may show
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()


def _tree(tmp_path):
    batch = tmp_path / "batch"
    (batch / "img").mkdir(parents=True)
    (batch / "img" / "good.png").write_bytes(_png((32, 32), noisy=False))  # a few hundred bytes
    (batch / "img" / "big.png").write_bytes(_png((64, 64), noisy=True))  # about 12 KiB
    (tmp_path / "secret.txt").write_text(f"aws_secret_access_key = {SECRET}\n")
    os.symlink(tmp_path, batch / "img" / "escape")
    return batch


def _rows(batch, http_rows):
    rows = {"good": "img/good.png", "absolute": str(batch.parent / "secret.txt"), "dot-dot": "img/../../secret.txt",
            "symlink": "img/escape/secret.txt", "oversized": "img/big.png", **http_rows}
    return [{"id": name, "prompt": "a lighthouse at dusk", "model": MODEL, "image": image, "width": 32, "height": 32,
             "num_inference_steps": 2} for name, image in rows.items()]


def _all_bytes(root) -> bytes:
    return b"".join(open(os.path.join(folder, name), "rb").read()
                    for folder, _, names in os.walk(root) for name in names)


def test_rows_that_point_outside_or_too_far_are_rejected_alone_and_never_shown(tmp_path):
    batch = _tree(tmp_path)
    with MediaServer("127.0.0.2", {"/secret.png": _png((32, 32), noisy=False)}) as inner, \
            MediaServer("127.0.0.1", {"/good.png": _png((32, 32), noisy=False)},
                        redirects={"/to-inner": inner.url("/secret.png")}) as outer:
        manifest = write_manifest(str(batch / "manifest.parquet"),
                                  _rows(batch, {"http-good": outer.url("/good.png"),
                                                "redirected": outer.url("/to-inner")}))
        out = tmp_path / "out"
        # both servers allowed: only the address rule (--media-refuse, loopback standing in for 169.254.169.254)
        # stops the redirect
        result = run_cli("run", manifest, "--out", str(out), "-q", "--media-max-mib", str(4096 / 2**20),
                         "--media-allow", outer.root, "--media-allow", inner.root, "--media-refuse", "127.0.0.2")
        assert inner.requests == []  # the refused address never saw a request
    assert result.returncode == 1, result.stderr[-3000:]  # one job failed; the good ones ran
    results = {row["id"]: row for row in pq.read_table(out / "results").to_pylist()}
    assert {name: row["status"] for name, row in results.items()} == {
        "good": "done", "http-good": "done", "absolute": "rejected", "dot-dot": "rejected", "symlink": "rejected",
        "oversized": "rejected", "redirected": "failed"}
    rejected = {row["id"]: row for row in pq.read_table(out / "rejected").to_pylist()}
    for name in ("absolute", "dot-dot", "symlink"):
        assert rejected[name]["column"] == "image"
        assert "outside the allowed media prefixes" in rejected[name]["reason"], rejected[name]
        assert str(batch) in rejected[name]["reason"] and "--media-allow" in rejected[name]["reason"]
    assert f"resolves to {tmp_path / 'secret.txt'}" in rejected["symlink"]["reason"]
    assert "over the 0.00390625 MiB a row's input may have" in rejected["oversized"]["reason"]
    assert "--media-max-mib" in rejected["oversized"]["reason"]
    assert "127.0.0.2 is a refused address" in results["redirected"]["error"]
    assert "redirected to http://127.0.0.2" in results["redirected"]["error"]
    assert SECRET not in result.stdout + result.stderr
    assert SECRET.encode() not in _all_bytes(out)  # no output, log, table or marker holds a byte of them
    assert set(os.listdir(out / "outputs")) == {"good.png", "http-good.png"}
    info = json.loads((out / "run.json").read_text())["options"]
    assert info["media_allow"] == [outer.root, inner.root] and info["media_refuse"] == ["127.0.0.2/32"]


def test_validate_rejects_the_same_rows_and_media_allow_admits_exactly_what_it_names(tmp_path):
    batch = _tree(tmp_path)
    manifest = write_manifest(str(batch / "manifest.parquet"), _rows(batch, {}))

    def rejected(*flags) -> dict:
        result = run_cli("validate", manifest, "--json", "--media-max-mib", str(4096 / 2**20), *flags)
        assert SECRET not in result.stdout + result.stderr
        return {problem["id"]: problem["reason"] for problem in json.loads(result.stdout)["problems"]}

    assert set(rejected()) == {"absolute", "dot-dot", "symlink", "oversized"}
    # the secret's folder admitted: the three rows that read it become valid (validation reads no bytes)
    assert set(rejected("--media-allow", str(tmp_path))) == {"oversized"}
    # a sibling of that folder, or the file's own name as a folder, admits nothing
    assert set(rejected("--media-allow", str(tmp_path) + "-other", "--media-allow",
                        str(tmp_path / "secret"))) == {"absolute", "dot-dot", "symlink", "oversized"}
    # a prefix may name one file: the three rows resolve to it
    assert set(rejected("--media-allow", str(tmp_path / "secret.txt"))) == {"oversized"}
