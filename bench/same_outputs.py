"""Do two commits write the same outputs? A matrix of `gen run` layouts (every parallel method, the step
caches, their combinations), run from each commit's own tree with the thread count pinned, and every output
file (PNG, MP4) compared byte for byte; the bytes each kind of transfer sent are compared too.

    python bench/same_outputs.py OLD_COMMIT [NEW_COMMIT] [--only NAME ...]   (NEW: the working tree)

Each side runs `python -m genbatch run` from a `git worktree` of its commit with PYTHONPATH at that tree and
OMP_NUM_THREADS=1, on one two-row manifest per model (tiny random-weight presets, 2-3 steps). The script prints
a line per (layout, output): `same` or `DIFFERENT`, and per layout the per-kind byte totals when they differ.
`bench/same_bytes.py` compares the final latents of the layout test's four-rank layouts the same way.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

VIDEO = ["--model", "tiny-wan", "--width", "64", "--height", "64", "--frames", "5", "--steps", "3"]
IMAGE = ["--model", "tiny-flux", "--width", "64", "--height", "64", "--steps", "3"]
SD3 = ["--model", "tiny-sd3", "--width", "64", "--height", "64", "--steps", "3"]

LAYOUTS: dict[str, list[str]] = {
    "wan one process": [*VIDEO],
    "flux one process": [*IMAGE],
    "sd3 one process": [*SD3],
    "wan ulysses2": [*VIDEO, "--nproc", "2", "--ulysses", "2"],
    "wan ring2": [*VIDEO, "--nproc", "2", "--ring", "2"],
    "wan cfg2": [*VIDEO, "--nproc", "2", "--cfg", "2"],
    "wan dp2": [*VIDEO, "--nproc", "2"],
    "wan tp2": [*VIDEO, "--nproc", "2", "--tp", "2"],
    "wan ulysses2 fsdp": [*VIDEO, "--nproc", "2", "--ulysses", "2", "--fsdp"],
    "wan tp2 fsdp": [*VIDEO, "--nproc", "2", "--tp", "2", "--fsdp"],
    "wan pipefusion2 patches2": [*VIDEO, "--nproc", "2", "--pipefusion", "2", "--patches", "2", "--warmup-steps", "1"],
    "flux pipefusion2 patches2": [*IMAGE, "--nproc", "2", "--pipefusion", "2", "--patches", "2", "--warmup-steps", "1"],
    "flux distrifusion2": [*IMAGE, "--nproc", "2", "--distrifusion", "2", "--warmup-steps", "1"],
    "sd3 distrifusion2": [*SD3, "--nproc", "2", "--distrifusion", "2", "--warmup-steps", "1"],
    "flux ulysses2": [*IMAGE, "--nproc", "2", "--ulysses", "2"],
    "sd3 cfg2": [*SD3, "--nproc", "2", "--cfg", "2"],
    "wan cache fbc": [*VIDEO, "--cache", "fbc:0.2"],
    "wan cache taylorseer": [*VIDEO, "--cache", "taylorseer:2"],  # no preset has TeaCache coefficients
    "flux cache taylorseer": [*IMAGE, "--cache", "taylorseer:2"],
    "wan cfg2 cache fbc": [*VIDEO, "--nproc", "2", "--cfg", "2", "--cache", "fbc:0.2"],
    "wan ulysses2 cache fbc": [*VIDEO, "--nproc", "2", "--ulysses", "2", "--cache", "fbc:0.2"],
    "wan pipefusion2 ulysses2": [*VIDEO, "--nproc", "4", "--pipefusion", "2", "--ulysses", "2", "--patches", "2",
                                 "--warmup-steps", "1"],
    "wan cfg2 ulysses2": [*VIDEO, "--nproc", "4", "--cfg", "2", "--ulysses", "2"],
}


def _manifest(path: Path) -> None:
    rows = {"id": ["a", "b"], "prompt": ["a red fox in the snow", "a lighthouse at dusk"], "seed": [7, 11]}
    pq.write_table(pa.table(rows), path)


def _worktree(repo: str, commit: str, where: str) -> str:
    subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", where, commit], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return where


def _run(tree: str, manifest: Path, out: Path, args: list[str]) -> dict[str, str]:
    """Run one layout from `tree`: {output file: sha256}, plus `bytes:<kind>` totals from its timings."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": tree}
    command = [sys.executable, "-m", "genbatch", "run", str(manifest), "--out", str(out), "--dtype", "fp32",
               "-q", *args]
    done = subprocess.run(command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        return {"exit": f"{done.returncode}: {done.stdout[-2000:]}"}
    digests = {}
    for path in sorted(out.rglob("*")):
        if path.suffix in (".png", ".mp4"):
            digests[str(path.relative_to(out))] = hashlib.sha256(path.read_bytes()).hexdigest()
    timings = sorted(out.rglob("*timings*.parquet")) or sorted(out.rglob("timings/*.parquet"))
    if timings:
        table = pa.concat_tables([pq.read_table(path) for path in timings], promote_options="default")
        for name in table.column_names:
            if name.startswith("bytes_"):
                digests[f"bytes:{name}"] = str(sum(value or 0 for value in table.column(name).to_pylist()))
    return digests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the commit to compare against")
    parser.add_argument("new", nargs="?", help="the newer commit (default: the working tree)")
    parser.add_argument("--only", nargs="+", default=None, help="run only these layouts (names as printed)")
    opts = parser.parse_args()
    layouts = {name: args for name, args in LAYOUTS.items() if opts.only is None or name in opts.only}
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    same = differ = 0
    with tempfile.TemporaryDirectory() as scratch:
        manifest = Path(scratch) / "manifest.parquet"
        _manifest(manifest)
        trees = {"old": _worktree(repo, opts.old, os.path.join(scratch, "old"))}
        trees["new"] = _worktree(repo, opts.new, os.path.join(scratch, "new")) if opts.new else repo
        try:
            for index, (name, args) in enumerate(layouts.items()):
                sides = {side: _run(tree, manifest, Path(scratch) / f"{side}-{index}", args)
                         for side, tree in trees.items()}
                old, new = sides["old"], sides["new"]
                if "exit" in old or "exit" in new:
                    print(f"{name}: FAILED old={old.get('exit', 'ok')} new={new.get('exit', 'ok')}")
                    differ += 1
                    continue
                for key in sorted(set(old) | set(new)):
                    equal = old.get(key) == new.get(key)
                    if key.startswith("bytes:"):
                        if not equal:
                            print(f"{name} {key}: {old.get(key)} -> {new.get(key)}")
                        continue
                    same += equal
                    differ += not equal
                    print(f"{name} {key}: " + ("same" if equal else "DIFFERENT"), flush=True)
        finally:
            for side in ("old", "new"):
                if trees.get(side) and trees[side] != repo:
                    subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", trees[side]], check=False)
    print(f"{same} outputs byte-identical, {differ} different or failed")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
