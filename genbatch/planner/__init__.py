"""The layout planner: rank parallel layouts for a model on some GPUs from a cost model (`gen plan`).

    best_layout("wan2.1-14b", 8, objective="latency")   # {'dp': 1, 'cfg': 2, 'ulysses': 4, ...}
    plan("flux.1-dev", 16, nodes=2, interconnect="ethernet", gpu="l40").ranked
    plan("flux.1-dev", 8, constraints=LayoutConstraints(ulysses=4)).best.layout.name   # 'dp2-ulysses4'

Modules: `shapes` (model facts), `hardware` (GPUs and links), `workload` (one job's size), `conditioning` (what
an image-conditioned job's VAE encodes), `layouts` (enumeration, placement, legality, names in the runner's
grammar), `constraints` (gen run's layout flags as filters, nearest fixes), `cost` (time and bytes), `memory`
(GiB per rank), `vae_memory` and `vae_encode` (the VAE's decode and encode peaks), `batching` (the largest batch
that fits, for `gen run --batch-size auto`), `rank` (objectives), `report` (table and JSON), `cli` (`gen plan`).

It imports no torch: the axes and the rules for combining them come from the axis table, `genbatch.parallel.axes`.
"""

from genbatch.planner.constraints import LayoutConstraints
from genbatch.planner.rank import Plan, best_layout, plan

__all__ = ["LayoutConstraints", "Plan", "best_layout", "plan"]
