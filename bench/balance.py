"""Dynamic hand-out against a static strided split, side by side, on a skewed manifest over 2 and 4 groups.

The manifest: many short tiny-wan jobs (3-7 steps) and a few 8x longer ones (40 steps), in genbatch's own
hand-out order (`hand_out_order`: largest estimated cost first). Each data-parallel group is a process that
iterates the REAL `genbatch.runner.handout.HandOut` (dynamic: an atomic counter in a real c10d TCPStore
shared by all processes; static: group g takes jobs g, g+G, ...), exactly as `gen run` does.

Job durations are SIMULATED: a group sleeps `estimated_flops(job) x seconds per FLOP` per job. Two CPU cores
cannot run four real groups side by side without contending, which would measure the CPU, not the
hand-out; sleeping groups do not contend. Two cases: durations exactly proportional to the estimate, and
durations off the estimate by a random factor (log-normal, sigma 0.3, the same draw for both strategies),
as real jobs are.

Prints, per case, groups and strategy: makespan and makespan / max(total work / groups, longest job)
(1.0 is a perfect split). Target: at most 1.05 for the dynamic hand-out with exact estimates.

A third case mixes 4 adapter sets (none, A, B, A+B, drawn per row) and charges a group `--switch-ms` each
time its next job's set differs from its last one's (a LoRA switch: `bench/lora_switch.py` measures one).
It runs the dynamic hand-out in genbatch's order (each model's jobs grouped by adapter set, largest first
within a set) and in an adapter-blind order (largest first over all jobs), and prints each group's switches
beside the makespan. The bound is the work's alone, so the ratio counts the switches too.

    python bench/balance.py [--short 96] [--long 9] [--unit-ms 40] [--switch-ms 20] [--groups 2 4] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import random
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from genbatch.jobs.cost import estimated_flops
from genbatch.jobs.schedule import hand_out_order
from genbatch.jobs.lora import LoraRef
from genbatch.jobs.spec import JobSpec
from genbatch.models import resolve_model
from genbatch.parallel.comm import Comm, CommLedger
from genbatch.parallel.context import ParallelContext
from genbatch.parallel.dims import ParallelDims
from genbatch.runner.handout import HandOut

STRATEGIES = ("static", "dynamic")
CASES = {"exact estimates": 0.0, "estimates off (sigma 0.3)": 0.3}
ADAPTER_SETS = ((), (LoraRef("/loras/a.safetensors"),), (LoraRef("/loras/b.safetensors"),),
                (LoraRef("/loras/a.safetensors"), LoraRef("/loras/b.safetensors", 0.5)))
"""The mixed-adapter case's 4 sets: none, A, B, A and B."""
ADAPTER_ORDERS = ("adapter-blind", "genbatch")


def skewed_jobs(short: int, long: int, seed: int) -> list[JobSpec]:
    """`short` jobs of 3-7 steps and `long` jobs of 40 steps (8x the 5-step mean), shuffled rows."""
    rng = random.Random(seed)
    steps = [rng.randint(3, 7) for _ in range(short)] + [40] * long
    rng.shuffle(steps)
    return [
        JobSpec(id=f"job-{row:03d}", prompt=f"prompt {row}", negative_prompt=None, model="tiny-wan", width=64,
                height=48, num_frames=9, num_inference_steps=count, guidance_scale=5.0, seed=row, fps=8, row=row)
        for row, count in enumerate(steps)
    ]


def with_adapter_sets(jobs: list[JobSpec], seed: int) -> list[JobSpec]:
    """`jobs`, each with one of the 4 `ADAPTER_SETS`, drawn per row."""
    rng = random.Random(seed)
    return [JobSpec(**{**_fields(job), "lora": rng.choice(ADAPTER_SETS)}) for job in jobs]


def adapter_blind_order(jobs: list[JobSpec]) -> list[JobSpec]:
    """Largest estimated cost first over all jobs, ties by row: the hand-out order without adapter groups."""
    spec = resolve_model(jobs[0].model)
    return sorted(jobs, key=lambda job: (-estimated_flops(job, spec), job.row))


def durations(jobs: list[JobSpec], unit_s: float, sigma: float, seed: int) -> dict[str, float]:
    """Seconds each job takes: proportional to its estimate (a 5-step job = unit_s), times noise."""
    spec = resolve_model(jobs[0].model)
    per_flop = unit_s / estimated_flops(JobSpec(**{**_fields(jobs[0]), "num_inference_steps": 5}), spec)
    rng = random.Random(seed)
    return {job.id: estimated_flops(job, spec) * per_flop * math.exp(rng.gauss(0.0, sigma)) for job in jobs}


def _fields(job: JobSpec) -> dict:
    return {name: getattr(job, name) for name in JobSpec.__slots__}


def _context(groups: int, group: int) -> ParallelContext:
    """The context of a one-rank job group `group` of `groups` (no collectives needed)."""
    ledger = CommLedger()
    solo = Comm(None, ledger)
    return ParallelContext(dims=ParallelDims(dp=groups), device=torch.device("cpu"), ledger=ledger, mesh=None,
                           rank=group, dp_rank=group, group=solo, cfg=solo, sp=solo, ring=solo, ulysses=solo)


def group_process(port: int, groups: int, group: int, scenarios: list[dict]) -> None:
    """One data-parallel group: for each scenario, wait for its start time, take its jobs, sleep them (and a
    switch before each job whose adapter set differs from the last job's, when the scenario charges one)."""
    store = dist.TCPStore("127.0.0.1", port, groups + 1, False, timeout=timedelta(seconds=120))
    ctx = _context(groups, group)
    store.set(f"ready/{group}", "1")
    for index, scenario in enumerate(scenarios):
        store.wait([f"go/{index}"])
        start = float(store.get(f"go/{index}"))
        time.sleep(max(0.0, start - time.time()))
        taken, switches, active = [], 0, ()
        for job in HandOut(jobs=scenario["jobs"], ctx=ctx, store=store, key=f"next/{index}",
                           dynamic=scenario["strategy"] == "dynamic"):
            if scenario["switch_s"] and job.lora != active:
                time.sleep(scenario["switch_s"])
                switches, active = switches + 1, job.lora
            time.sleep(scenario["seconds"][job.id])
            taken.append(job.id)
        store.set(f"done/{index}/{group}", json.dumps({"end": time.time(), "jobs": taken, "switches": switches}))


def measure(groups: int, scenarios: list[dict]) -> list[dict]:
    """Start `groups` processes once, run every scenario in them; per scenario its makespan and jobs."""
    store = dist.TCPStore("127.0.0.1", 0, groups + 1, True, timeout=timedelta(seconds=120), wait_for_workers=False)
    spawn = multiprocessing.get_context("spawn")
    workers = [spawn.Process(target=group_process, args=(store.port, groups, g, scenarios))
               for g in range(groups)]
    for worker in workers:
        worker.start()
    store.wait([f"ready/{g}" for g in range(groups)])  # processes started (imports take seconds)
    results = []
    for index, scenario in enumerate(scenarios):
        start = time.time() + 0.3  # every group starts at the same moment
        store.set(f"go/{index}", repr(start))
        done = [json.loads(store.get(f"done/{index}/{g}")) for g in range(groups)]
        taken = sorted(job for group in done for job in group["jobs"])
        assert taken == sorted(job.id for job in scenario["jobs"]), "a job was lost or handed out twice"
        results.append({"makespan": max(group["end"] for group in done) - start,
                        "jobs_per_group": [len(group["jobs"]) for group in done],
                        "switches": [group["switches"] for group in done]})
    for worker in workers:
        worker.join(30)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", type=int, default=96, help="short jobs (3-7 steps)")
    parser.add_argument("--long", type=int, default=9, help="long jobs (40 steps: 8x the short mean)")
    parser.add_argument("--unit-ms", type=float, default=40.0, help="simulated milliseconds of a 5-step job")
    parser.add_argument("--switch-ms", type=float, default=20.0,
                        help="simulated milliseconds of a LoRA switch (the mixed-adapter case)")
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    plain = skewed_jobs(args.short, args.long, args.seed)
    jobs = hand_out_order(plain, resolve_model)
    mixed = with_adapter_sets(plain, args.seed + 2)
    orders = {"adapter-blind": adapter_blind_order(mixed), "genbatch": hand_out_order(mixed, resolve_model)}
    print(f"{len(jobs)} jobs ({args.short} short, {args.long} 8x longer) in hand-out order; a 5-step job "
          f"sleeps {args.unit_ms:.0f} ms, a LoRA switch {args.switch_ms:.0f} ms; ratio = makespan / max(total "
          "work / groups, longest job)")
    print(f"{'case':<28}{'groups':>7}{'strategy':>23}{'makespan s':>12}{'bound s':>9}{'ratio':>8}  "
          "jobs per group; switches per group")
    for groups in args.groups:
        scenarios = []
        for case, sigma in CASES.items():
            seconds = durations(jobs, args.unit_ms / 1000.0, sigma, args.seed + 1)
            bound = max(sum(seconds.values()) / groups, max(seconds.values()))
            scenarios += [{"case": case, "strategy": s, "jobs": jobs, "seconds": seconds, "bound": bound,
                           "switch_s": 0.0} for s in STRATEGIES]
        seconds = durations(mixed, args.unit_ms / 1000.0, 0.0, args.seed + 1)
        bound = max(sum(seconds.values()) / groups, max(seconds.values()))
        scenarios += [{"case": f"{len(ADAPTER_SETS)} adapter sets, exact", "strategy": "dynamic", "order": order,
                       "jobs": orders[order], "seconds": seconds, "bound": bound, "switch_s": args.switch_ms / 1000.0}
                      for order in ADAPTER_ORDERS]
        for scenario, result in zip(scenarios, measure(groups, scenarios)):
            ratio = result["makespan"] / scenario["bound"]
            strategy = scenario["strategy"] + (f" {scenario['order']}" if "order" in scenario else "")
            switches = f"; {result['switches']}" if scenario["switch_s"] else ""
            print(f"{scenario['case']:<28}{groups:>7}{strategy:>23}{result['makespan']:>12.2f}"
                  f"{scenario['bound']:>9.2f}{ratio:>8.3f}  {result['jobs_per_group']}{switches}", flush=True)


if __name__ == "__main__":
    main()
