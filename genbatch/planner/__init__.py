"""The layout planner: rank parallel layouts for a model on some GPUs from a cost model (`gen plan`).

    best_layout("wan2.1-14b", 8, objective="latency")   # {'dp': 1, 'cfg': 2, 'ulysses': 4, ...}
    plan("flux.1-dev", 16, nodes=2, interconnect="ethernet", gpu="l40").ranked

Modules: `shapes` (model facts), `hardware` (GPUs and links), `workload` (one job's size), `layouts`
(enumeration, placement, legality), `cost` (time and bytes), `memory` (GiB per rank), `rank` (objectives),
`report` (table and JSON), `cli` (`gen plan`).
"""

from genbatch.planner.rank import Plan, best_layout, plan

__all__ = ["Plan", "best_layout", "plan"]
