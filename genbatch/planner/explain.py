"""Why an estimate is what it is: its inputs, the parameters that priced them (and where each came from),
and the terms of the sum, so `gen plan --json` can be checked by hand.

    seconds_per_job = steps x (compute + fixed + exposed communication) / batch + pipeline + encode + decode

(a batch of B rows shares its steps: each per-step term counts 1/B to a job; the VAE encode, for a job that starts
from an image, and the decode run row by row).
"""

from __future__ import annotations

from dataclasses import asdict

from genbatch.parallel.dims import ParallelDims
from genbatch.planner.cost import (
    ATTENTION_EFFICIENCY,
    GEMM_EFFICIENCY,
    GEMM_HALF_ROWS,
    Estimate,
    core_slowdown,
    layer_overhead,
    step_terms,
)
from genbatch.planner.hardware import Cluster
from genbatch.planner.memory import encode_ranks
from genbatch.planner.profile import COLLECTIVE_OF_AXIS, Profile
from genbatch.planner.workload import Workload


def round_figures(value: float, digits: int = 4) -> float:
    """`value` to `digits` significant figures (what the JSON plan shows)."""
    return float(f"{value:.{digits}g}")


def _source(profile: Profile | None, measured) -> str:
    return f"profile {profile.name}" if measured is not None else "published"


def _links(cluster: Cluster) -> dict:
    links = (cluster.intra, cluster.cross_socket, cluster.inter)
    return {link.name: link for link in links if link is not None}


def parameters(cost: Estimate, cluster: Cluster, profile: Profile | None) -> dict:
    """Each free parameter the estimate used, its value and its source (`published` or `profile NAME`)."""
    peak = cluster.gpu.bf16_tflops
    given = profile or Profile(name="", device=cluster.gpu.name)
    values = {
        "gemm_tflops": (given.gemm_tflops if given.gemm_tflops is not None else peak * GEMM_EFFICIENCY,
                        _source(profile, given.gemm_tflops)),
        "gemm_half_rows": (given.gemm_half_rows if given.gemm_half_rows is not None else GEMM_HALF_ROWS,
                           _source(profile, given.gemm_half_rows)),
        "attention_tflops": (given.attention_tflops if given.attention_tflops is not None
                             else peak * ATTENTION_EFFICIENCY, _source(profile, given.attention_tflops)),
        "layer_overhead_s": (layer_overhead(profile), _source(profile, given.layer_overhead_s)),
        "core_slowdown": (core_slowdown(given.core_sharing, cluster.gpus_per_node, given.cpu_cores), _source(profile, given.core_sharing)),
    }
    out = {name: {"value": round_figures(value), "source": source} for name, (value, source) in values.items()}
    links = _links(cluster)
    comm = {}
    for axis, link_name in cost.links.items():
        kind, link = COLLECTIVE_OF_AXIS[axis], links[link_name]
        bandwidth, latency = given.bandwidth(link_name, kind), given.latency(link_name, kind)
        comm[axis] = {
            "link": link_name, "kind": kind,
            "gbs": round_figures(bandwidth if bandwidth is not None else link.gbs),
            "latency_s": round_figures(latency if bandwidth is not None and latency is not None else link.latency_s),
            "source": _source(profile, bandwidth),
        }
    out["communication"] = comm
    return out


def explain(layout: ParallelDims, work: Workload, cluster: Cluster, cost: Estimate, profile: Profile | None) -> dict:
    """The estimate's inputs, the parameters that priced them, the profile, and the terms of its sum."""
    terms = step_terms(layout, work, cluster)
    steps = work.steps / work.batch  # a job's share of its batch's steps
    per_job = {
        "compute_s": steps * cost.compute_s,
        "fixed_s": steps * cost.overhead_s,
        "exposed_comm_s": steps * cost.comm_exposed_s,
        "pipeline_s": cost.pipeline_s,
        "encode_s": cost.encode_s,
        "decode_s": cost.decode_s,
    }
    return {
        "profile": profile.name if profile is not None else None,
        "inputs": {
            "steps": work.steps,
            "tokens": work.sequence,
            "batch_size": work.batch,
            "vae_decode": cost.decode_mode,
            "vae_encode": None if work.encode is None else {
                "width": work.encode.width, "height": work.encode.height, "frames": work.encode.frames,
                "ranks": encode_ranks(layout, work)},
            **{name: value if isinstance(value, int) else round_figures(value) for name, value in asdict(terms).items()},
            "comm_bytes_per_step": {axis: int(nbytes) for axis, nbytes in cost.comm_bytes.items()},
            "comm_messages_per_step": {axis: round_figures(count) for axis, count in cost.comm_messages.items()},
        },
        "parameters": parameters(cost, cluster, profile),
        "terms_s_per_job": {name: round_figures(value) for name, value in per_job.items()},
        "sum_s_per_job": round_figures(sum(per_job.values())),
    }
