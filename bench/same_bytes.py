"""Do two commits give the same bytes? Every layout of the layout test, run from each commit's own tree on
this machine, with the thread count pinned, and the final latents compared byte for byte.

    python bench/same_bytes.py OLD_COMMIT [NEW_COMMIT]     (NEW defaults to the working tree)

Each side runs `tests/parallel/test_layouts.py`'s one-process reference and four-rank layouts from a
`git worktree` of its commit (its own genbatch, its own test helpers), with OMP_NUM_THREADS=1 and one torch
thread per rank on both sides, and saves every rank's final latents. The script prints one line per
(layout, rank): `same` when the bytes are equal, else the largest difference. Only layouts both commits
know are compared (a newer commit's added models are reported as new).
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile

import numpy as np

_RUNNER = r'''
import os, pickle, sys
sys.path.insert(0, os.getcwd())
import torch
torch.set_num_threads(1)
import genbatch
assert genbatch.__file__.startswith(os.getcwd()), (genbatch.__file__, os.getcwd())
import tests.parallel.test_layouts as T
from tests.support.distributed import run_on_ranks

def main(out):
    names = lambda layouts: [f"{j.model} dp{dp} cfg{cfg} ring{r} ulysses{u}{' fsdp' if f else ''}"
                             for j, dp, cfg, r, u, f in layouts]
    models = {layout[0].model: layout[0] for layout in T.FOUR_RANKS}
    results = {f"{name} reference": [T._run_job(job, None, 1, 1, 1, False, out=f"{out}/ref/{name}")[0].numpy()]
               for name, job in models.items()}
    per_rank = run_on_ranks(T._all_layouts, 4, args=(T.FOUR_RANKS, f"{out}/four"), timeout_s=120)
    for index, name in enumerate(names(T.FOUR_RANKS)):
        results[name] = [ranks[index][0].numpy() for ranks in per_rank]
    with open(f"{out}/latents.pkl", "wb") as handle:
        pickle.dump(results, handle)

if __name__ == "__main__":
    main(sys.argv[1])
'''


def _run(tree: str, out: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": tree}
    script = os.path.join(out, "run_layouts.py")
    with open(script, "w", encoding="utf-8") as handle:
        handle.write(_RUNNER)
    subprocess.run([sys.executable, script, out], cwd=tree, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "latents.pkl"), "rb") as handle:
        return pickle.load(handle)


def _worktree(repo: str, commit: str, where: str) -> str:
    subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", where, commit], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", help="the commit to compare against")
    parser.add_argument("new", nargs="?", help="the newer commit (default: the working tree)")
    opts = parser.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"old": _worktree(repo, opts.old, os.path.join(scratch, "old"))}
        trees["new"] = _worktree(repo, opts.new, os.path.join(scratch, "new")) if opts.new else repo
        try:
            latents = {}
            for side, tree in trees.items():
                out = os.path.join(scratch, f"{side}-out")
                os.makedirs(out)
                latents[side] = _run(tree, out)
        finally:
            for side in ("old", "new"):
                if trees.get(side) and trees[side] != repo:
                    subprocess.run(["git", "-C", repo, "worktree", "remove", "--force", trees[side]], check=False)
    old, new = latents["old"], latents["new"]
    same = differ = 0
    for name in old:
        if name not in new:
            print(f"{name}: missing in the new commit")
            differ += 1
            continue
        for rank, (a, b) in enumerate(zip(old[name], new[name])):
            equal = a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
            same += equal
            differ += not equal
            print(f"{name} rank {rank}: " + ("same" if equal else f"DIFFERENT (max {np.abs(a - b).max():.3g})"))
    for name in sorted(set(new) - set(old)):
        print(f"{name}: new in the new commit")
    print(f"{same} (layout, rank) latents byte-identical, {differ} different")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
