"""A plan as JSON-ready data and as a text table that shows why each layout ranks where it does."""

from __future__ import annotations

import textwrap

from genbatch.parallel.axes import AXES, AXIS, STALE_AXES
from genbatch.parallel.dims import ParallelDims
from genbatch.jobs.counts import counted
from genbatch.planner.command import run_command
from genbatch.planner.explain import explain, round_figures as _round
from genbatch.planner.layouts import plan_degrees
from genbatch.planner.rank import STALE_MARGIN, Candidate, Plan, Rejection

SCHEMA_VERSION = 9
"""Bumped when a field of `plan_to_dict` changes meaning, goes away or is added (2: PipeFusion's degree is `pp`,
the runner's axis name, and every layout carries its `layout` name; 3: the plan names its `profile` and every
layout carries `explain`: its inputs, parameters and their sources, and the terms of its sum; 4: every layout
carries its `vae_decode` mode, `vae_parallel` counts the ranks that decode (1 when the leader decodes alone),
and a layout rejected for memory carries `over` (the number that broke the limit) and `fix` (the change that
fits with the fewest seconds per job, or null); 5: every layout carries its `distrifusion` degree, and its
`memory_gib` the `stale_kv` part of its activations (the previous step's K/V of PipeFusion and DistriFusion); 6: `available` and `note` go, as the runner runs every
layout the planner ranks (the axis table's one rule set, `parallel/axes.py`); 7: the workload carries its
`batch_size` and the `encode` its VAE runs first (null for a job from noise alone), `memory_gib` a `vae_encode`
part, the breakdown `encode_s_per_job`, and `explain` its `encode_s` term and `vae_encode` and `batch_size`
inputs; 8: the workload carries its `quantization` and `quantize_text_encoder`, and a layout rejected for memory
its `quantization_fix`, the least quantization with which it fits, or null); 9: `run` gives the command that runs the best layout (`command`: run or submit, `flags`, `line`;
null when none runs), and FSDP over one rank is no layout, so a layout's `fsdp` is 1 or at least 2 with `fsdp` in
its name)."""


def layout_to_dict(layout: ParallelDims, decode_mode: str = "parallel") -> dict:
    """A layout's name in the runner's grammar (`dp2-cfg2-ulysses4-fsdp`) and its degrees."""
    return {"layout": layout.name, **plan_degrees(layout, decode_mode)}


def rejection_to_dict(rejection: Rejection) -> dict:
    """A rejected layout with its reasons; for one too big for memory, the overage and the best fix."""
    out = {**layout_to_dict(rejection.layout), "reasons": list(rejection.reasons)}
    if rejection.over is not None:
        out["over"] = rejection.over.to_dict()
        out["fix"] = rejection.fix.to_dict() if rejection.fix is not None else None
        fix = rejection.quantization_fix
        out["quantization_fix"] = fix.to_dict() if fix is not None else None
    return out


def candidate_to_dict(candidate: Candidate, plan: Plan) -> dict:
    """One ranked layout: its name and degrees, its estimates, the parts behind them and their explanation."""
    cost = candidate.estimate
    return {
        **layout_to_dict(candidate.layout, cost.decode_mode),
        "vae_decode": cost.decode_mode,
        "seconds_per_job": _round(cost.seconds_per_job),
        "seconds_per_step": _round(cost.seconds_per_step),
        "jobs_per_hour": _round(candidate.jobs_per_hour),
        "memory_per_rank_gib": _round(cost.memory_per_rank_gib),
        "comm_bytes_per_step": int(cost.comm_bytes_per_step),
        "breakdown": {
            "compute_s_per_step": _round(cost.compute_s),
            "overhead_s_per_step": _round(cost.overhead_s),
            "comm_s_per_step": _round(cost.comm_s),
            "comm_exposed_s_per_step": _round(cost.comm_exposed_s),
            "decode_s_per_job": _round(cost.decode_s),
            "encode_s_per_job": _round(cost.encode_s),
            "pipeline_s_per_job": _round(cost.pipeline_s),
            "comm_bytes_per_step": {axis: int(nbytes) for axis, nbytes in cost.comm_bytes.items()},
            "links": dict(cost.links),
            "memory_gib": {part: _round(gib) for part, gib in cost.memory.items()},
        },
        "explain": explain(candidate.layout, plan.work, plan.cluster, cost, plan.profile),
    }


def plan_to_dict(plan: Plan, *, model: str | None = None) -> dict:
    """The whole plan: inputs, the layouts best first, the best runnable one and the command that runs it (for
    `model`, the name given to `gen plan`; default the plan's), and the rejected with reasons."""
    work, cluster = plan.work, plan.cluster
    try:
        best = layout_to_dict(plan.best.layout, plan.best.estimate.decode_mode)
        command = run_command(plan, model or work.shape.name).to_dict()
    except ValueError:
        best = command = None
    return {
        "schema": SCHEMA_VERSION,
        "model": work.shape.name,
        "workload": {
            "width": work.width,
            "height": work.height,
            "frames": work.frames,
            "steps": work.steps,
            "tokens": work.sequence,
            "image_tokens": work.image_tokens,
            "offload_text_encoder": work.offload_text_encoder,
            "batch_size": work.batch,
            "quantization": work.quantization.kind,
            "quantize_text_encoder": work.quantization.text_encoders,
            "encode": None if work.encode is None else {
                "what": work.encode.what, "width": work.encode.width, "height": work.encode.height,
                "frames": work.encode.frames,
            },
        },
        "cluster": {
            "gpu": cluster.gpu.name,
            "gpus": cluster.gpus,
            "nodes": cluster.nodes,
            "gpu_mem_gib": cluster.memory_gib,
            "intra_node": cluster.intra.name,
            "network": cluster.inter.name if cluster.inter else None,
        },
        "profile": None if plan.profile is None else {
            "name": plan.profile.name, "device": plan.profile.device, "fit": plan.profile.fit,
        },
        "objective": plan.objective,
        "max_latency": plan.max_latency,
        "constraints": plan.constraints.given,
        "best": best,
        "run": command,
        "layouts": [candidate_to_dict(candidate, plan) for candidate in plan.ranked],
        "rejected": [rejection_to_dict(rejection) for rejection in plan.rejected],
    }




def _degree_cells(layout: ParallelDims) -> list[str]:
    """Each axis's degree, then `fsdp` on or off (as `gen run --fsdp` is)."""
    return [str(layout.degree(axis)) for axis in AXES] + ["on" if layout.fsdp else "off"]


def _fixed(value: float, decimals: int) -> str:
    """`value` with `decimals` decimals, never `-0.000` (a negative that rounds to zero is zero)."""
    text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def rejections_by_reason(rejections: tuple[Rejection, ...] | list[Rejection]) -> dict[str, list[str]]:
    """Each reason once, in the order first given, with the names of the layouts it rejects."""
    grouped: dict[str, list[str]] = {}
    for rejection in rejections:
        for reason in rejection.reasons:
            grouped.setdefault(reason, []).append(rejection.layout.name)
    return grouped


def _names(names: list[str], indent: str = "    ", width: int = 110) -> list[str]:
    """Every name, comma-separated, wrapped into lines of at most `width` characters."""
    return textwrap.wrap(", ".join(names), width=width, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False)


def format_table(plan: Plan, *, top: int = 10, rejected: int = 12, model: str | None = None) -> str:
    """The ranked layouts (at most `top`) by name with the numbers behind their rank, the command that runs the
    best (for `model`, the name given to `gen plan`; default the plan's), then each reason for rejecting layouts
    once with the layouts it rejects (at most `rejected` reasons)."""
    work, cluster = plan.work, plan.cluster
    network = f", {cluster.nodes} nodes over {cluster.inter.name}" if cluster.inter else ""
    lines = [
        f"{work.describe()}",
        f"{cluster.gpus} x {cluster.gpu.name} ({cluster.memory_gib:g} GiB, {cluster.intra.name} in a node{network}); "
        f"objective: {plan.objective}" + (f", max latency {plan.max_latency:g} s" if plan.max_latency else "")
        + (f"; only layouts with {plan.constraints.flags()}" if plan.constraints.given else ""),
        "",
    ]
    encodes = work.encode is not None
    header = ["#", "layout", *(AXIS[axis].short for axis in AXES), "fsdp", "s/job", "s/step", "jobs/h", "compute", "comm",
              "exposed", "GB/step", "GiB/rank", "weights", "act", "vae", *(("enc", "enc s") if encodes else ()),
              "decode"]
    rows = [header]
    for index, candidate in enumerate(plan.ranked[:top], start=1):
        cost, memory = candidate.estimate, candidate.estimate.memory
        rows.append([
            str(index), candidate.layout.name, *_degree_cells(candidate.layout),
            _fixed(cost.seconds_per_job, 2), _fixed(cost.seconds_per_step, 3), _fixed(candidate.jobs_per_hour, 1),
            _fixed(cost.compute_s, 3), _fixed(cost.comm_s, 3), _fixed(cost.comm_exposed_s, 3),
            _fixed(cost.comm_bytes_per_step / 1e9, 2), _fixed(memory["total"], 1), _fixed(memory["weights"], 1),
            _fixed(memory["activations"], 1), _fixed(memory["vae_decode"], 1),
            *((_fixed(memory["vae_encode"], 1), _fixed(cost.encode_s, 2)) if encodes else ()), cost.decode_mode,
        ])
    widths = [max(len(row[column]) for row in rows) for column in range(len(header) - 1)]
    for row in rows:
        cells = [cell.ljust(width) if column == 1 else cell.rjust(width)
                 for column, (cell, width) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells + [row[-1]]).rstrip())
    if len(plan.ranked) > top:
        lines.append(f"... {len(plan.ranked) - top} more legal layouts (--top N, or --json for all)")
    lines.append("(seconds: compute, comm (all traffic) and exposed (left after overlap) per step; memory in GiB "
                 "per rank: total, weights, denoise activations, VAE decode peak"
                 + ("; enc: the VAE encode's peak (GiB) and seconds per job, patch-parallel over the job group"
                    if encodes else "")
                 + "; decode: parallel over the job group, full on its leader, or tiled there (blended tiles) when "
                 "no exact mode fits)")
    stale = [f"{AXIS[axis].short} ({method})" for axis, method in STALE_AXES.items()
             if any(candidate.layout.degree(axis) > 1 for candidate in plan.ranked[:top])]
    if stale:
        lines.append(f"({' and '.join(stale)} reuse{'s' if len(stale) == 1 else ''} stale K/V: ranked above exact "
                     f"layouts only when {STALE_MARGIN:.0%} faster)")
    try:
        command = run_command(plan, model or plan.work.shape.name)
        lines.append(f"best runnable: {plan.best.layout.name}; run it with (your manifest and output for MANIFEST "
                     "and OUT):")
        lines.append(f"  {command.line()}")
    except ValueError as error:
        lines.append(f"no runnable layout: {error}")
    if plan.rejected:
        reasons = rejections_by_reason(plan.rejected)
        lines.append("")
        lines.append(f"rejected {counted(len(plan.rejected), 'layout')}, for {counted(len(reasons), 'reason')}:")
        for reason, names in list(reasons.items())[:rejected]:
            lines.append(f"  {reason}:")
            lines += _names(names)
        if len(reasons) > rejected:
            lines.append(f"  ... {counted(len(reasons) - rejected, 'more reason')} (--json lists all)")
    return "\n".join(lines)
