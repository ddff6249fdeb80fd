"""What the planner knows about GPUs and the links between them, each number with where it comes from.

Seed 000 is the reference the planner must agree with: its NVLink figure (H100, 900 GB/s bidirectional,
"all-reduce 有效约 300 GB/s", sections 3.2 and 11 Q1) and its Ethernet figure (25 Gbps, "约 3 GB/s",
section 11 Q2) are used as given. Peak tensor throughput is the vendor's dense (no sparsity) BF16 figure.
Bandwidths are per GPU, effective for NCCL collectives, in GB/s (1e9 bytes per second).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
"""Bytes per GiB (memory is reported in GiB, as nvidia-smi does)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuType:
    """One GPU model: its compute, memory and the link its usual servers give it."""

    name: str
    """The name `--gpu` takes."""
    bf16_tflops: float
    """Dense BF16 (FP16 where the GPU has no BF16) tensor-core peak, TFLOP/s, from the vendor datasheet."""
    memory_gib: float
    """Memory a process can use, GiB (nvidia-smi's total)."""
    link: str
    """The GPU-to-GPU link of its usual 8-GPU server: `nvlink` or `pcie`."""
    nvlink_gbs: float = 0.0
    """Effective per-GPU NVLink bandwidth for collectives, GB/s (0 without NVLink)."""
    fp8_tflops: float | None = None
    """Dense FP8 tensor-core peak, TFLOP/s, for GPUs that run FP8 GEMMs (compute capability 8.9 or more: Ada,
    Hopper, Blackwell); None for those that do not (their fp8 weights are dequantized into bf16 GEMMs)."""
    source: str = ""
    """Where the figures come from."""


# Effective NVLink bandwidth = 1/3 of the bidirectional figure, the ratio seed 000 uses for H100 (900 -> 300).
GPUS: dict[str, GpuType] = {
    gpu.name: gpu
    for gpu in (
        GpuType(name="h100", bf16_tflops=989.4, memory_gib=79.6, link="nvlink", nvlink_gbs=300.0, fp8_tflops=1978.9,
                source="NVIDIA H100 SXM5 datasheet (989 TFLOP/s BF16 and 1,979 FP8 dense, 80 GB); NVLink 300 GB/s: "
                "seed 000 §3.2"),
        GpuType(name="h200", bf16_tflops=989.4, memory_gib=140.4, link="nvlink", nvlink_gbs=300.0, fp8_tflops=1978.9,
                source="NVIDIA H200 SXM datasheet (989 TFLOP/s BF16 and 1,979 FP8 dense, 141 GB, NVLink 900 GB/s as "
                "H100)"),
        GpuType(name="b200", bf16_tflops=2250.0, memory_gib=179.0, link="nvlink", nvlink_gbs=600.0, fp8_tflops=4500.0,
                source="NVIDIA HGX B200 datasheet (2.25 PFLOP/s BF16 and 4.5 FP8 dense, 180 GB, NVLink5 1.8 TB/s)"),
        GpuType(name="h20", bf16_tflops=148.0, memory_gib=95.6, link="nvlink", nvlink_gbs=300.0, fp8_tflops=296.0,
                source="NVIDIA H20 spec sheet (148 TFLOP/s BF16 and 296 FP8 dense, 96 GB, NVLink 900 GB/s)"),
        GpuType(name="a100", bf16_tflops=312.0, memory_gib=80.0, link="nvlink", nvlink_gbs=200.0,
                source="NVIDIA A100 SXM 80GB datasheet (312 TFLOP/s BF16 dense, NVLink3 600 GB/s); "
                "seed 003 measured ~268 GB/s P2P on 8xA100 NVLink"),
        GpuType(name="v100", bf16_tflops=125.0, memory_gib=31.7, link="nvlink", nvlink_gbs=100.0,
                source="NVIDIA V100 SXM2 32GB datasheet (125 TFLOP/s FP16 tensor, NVLink2 300 GB/s)"),
        GpuType(name="l40", bf16_tflops=181.0, memory_gib=45.0, link="pcie", fp8_tflops=362.0,
                source="NVIDIA L40 datasheet (362 TFLOP/s BF16 and 724 FP8 with sparsity -> 181 and 362 dense, 48 GB, "
                "PCIe Gen4)"),
        GpuType(name="l40s", bf16_tflops=362.0, memory_gib=45.0, link="pcie", fp8_tflops=733.0,
                source="NVIDIA L40S datasheet (733 TFLOP/s BF16 and 1,466 FP8 with sparsity -> 362 and 733 dense, "
                "48 GB, PCIe Gen4)"),
        GpuType(name="l20", bf16_tflops=119.5, memory_gib=45.0, link="pcie", fp8_tflops=239.0,
                source="NVIDIA L20 spec sheet (239 TFLOP/s FP16 and 478 FP8 with sparsity -> 119.5 and 239 dense, "
                "48 GB, PCIe Gen4)"),
        GpuType(name="a10", bf16_tflops=125.0, memory_gib=22.5, link="pcie",
                source="NVIDIA A10 datasheet (125 TFLOP/s BF16 dense, 24 GB, PCIe Gen4)"),
        GpuType(name="rtx4090", bf16_tflops=165.2, memory_gib=24.0, link="pcie", fp8_tflops=330.3,
                source="NVIDIA Ada whitepaper (RTX 4090: 165.2 TFLOP/s BF16 and 330.3 FP8 dense with FP32 "
                "accumulate, 24 GB)"),
    )
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """A kind of connection a collective can run over."""

    name: str
    """`nvlink`, `pcie`, `pcie-cross-socket`, `ethernet` or `infiniband`."""
    gbs: float
    """Effective per-GPU bandwidth, GB/s."""
    latency_s: float
    """Fixed cost of one collective or transfer on this link, seconds."""
    source: str = ""
    """Where the figures come from."""


INTRA_LATENCY_S = 10e-6
"""Per-collective latency inside a node: fitted to xDiT's FLUX.1-dev table (seed 000 §1) with the rest of the
cost model; the order of NCCL's small-message latency inside a node."""
INTER_LATENCY_S = 30e-6
"""Per-collective latency between nodes: assumed, three times the in-node figure (a NIC and a switch hop)."""

PCIE = Link(name="pcie", gbs=24.0, latency_s=INTRA_LATENCY_S,
            source="seed 003: measured P2P 23 GB/s (4xA100 PCIe) and 26 GB/s (8xL20 PCIe)")
PCIE_CROSS_SOCKET = Link(
    name="pcie-cross-socket", gbs=5.0, latency_s=INTRA_LATENCY_S,
    source="calibrated: the bandwidth at which the model reproduces seed 001 §6 (8xL40 PCIe no faster than 4, "
    "'需要经过QPI通信') for FLUX.1 and HunyuanDiT at 1024px",
)
ETHERNET_GBPS = 25.0
"""Default Ethernet between nodes, Gbit/s: seed 000 §11 Q2 ("25 Gbps 以太网（约 3 GB/s）")."""
INFINIBAND_GBPS = 200.0
"""Default InfiniBand per GPU, Gbit/s: one HDR 200 Gb/s ConnectX-6 NIC per GPU (NVIDIA DGX A100 spec)."""
GPUS_PER_SOCKET = 4
"""GPUs under one CPU socket in an 8-GPU PCIe server (dual-socket, 4 GPUs per root complex; seed 001 §6.2)."""


def _network(name: str, gbps: float | None) -> Link:
    if name == "ethernet":
        rate = ETHERNET_GBPS if gbps is None else gbps
        # seed 000 §11 Q2 counts 25 Gbps as about 3 GB/s: rate / 8 bits, less framing overhead.
        return Link(name="ethernet", gbs=rate / 8 * 0.96, latency_s=INTER_LATENCY_S,
                    source=f"{rate:g} Gbit/s Ethernet (seed 000 §11 Q2: 25 Gbps ~ 3 GB/s)")
    rate = INFINIBAND_GBPS if gbps is None else gbps
    return Link(name="infiniband", gbs=rate / 8 * 0.96, latency_s=INTER_LATENCY_S,
                source=f"{rate:g} Gbit/s InfiniBand per GPU")


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """The GPUs a run is given and how they are connected."""

    gpu: GpuType
    """The GPU model (all GPUs alike)."""
    gpus: int
    """GPUs in total."""
    nodes: int
    """Machines the GPUs are spread over, evenly."""
    memory_gib: float
    """Memory per GPU the planner may fill, GiB."""
    intra: Link
    """The link between GPUs of one node (one socket, for PCIe servers)."""
    cross_socket: Link | None
    """PCIe servers: the link between GPUs under different CPU sockets; None on NVLink servers."""
    inter: Link | None
    """The link between nodes; None on one node."""

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


NODE_LINKS = ("nvlink", "pcie")
NETWORKS = ("ethernet", "infiniband")


def make_cluster(
    gpus: int,
    *,
    nodes: int = 1,
    gpu: str = "h100",
    gpu_mem: float | None = None,
    interconnect: str | None = None,
    intra_node: str | None = None,
    network_gbps: float | None = None,
) -> Cluster:
    """Validate the hardware description and build a `Cluster`.

    `interconnect` names the slowest link: between GPUs on one node (`nvlink`, `pcie`), or between nodes when
    `nodes > 1` (`ethernet`, `infiniband`; default `infiniband`). `intra_node` overrides the in-node link,
    which defaults to the GPU's usual one. `network_gbps` overrides the inter-node rate in Gbit/s.
    """
    gpu_type = GPUS.get(gpu.lower())
    if gpu_type is None:
        raise ValueError(f"unknown --gpu {gpu!r}; choose one of {', '.join(GPUS)}")
    if gpus < 1:
        raise ValueError(f"--gpus {gpus} must be at least 1")
    if nodes < 1 or gpus % nodes:
        raise ValueError(f"--gpus {gpus} cannot be spread evenly over --nodes {nodes}; give a divisor of {gpus}")
    if gpu_mem is not None and gpu_mem <= 0:
        raise ValueError(f"--gpu-mem {gpu_mem} must be positive (GiB per GPU)")
    if network_gbps is not None and network_gbps <= 0:
        raise ValueError(f"--network-gbps {network_gbps} must be positive")
    interconnect = interconnect.lower() if interconnect else None
    if interconnect is not None and interconnect not in NODE_LINKS + NETWORKS:
        raise ValueError(f"unknown --interconnect {interconnect!r}; choose one of {', '.join(NODE_LINKS + NETWORKS)}")
    if intra_node is not None and intra_node.lower() not in NODE_LINKS:
        raise ValueError(f"unknown --intra-node {intra_node!r}; choose nvlink or pcie")
    if nodes == 1:
        if interconnect in NETWORKS:
            raise ValueError(
                f"--interconnect {interconnect} links nodes, but --nodes is 1; "
                "give nvlink or pcie for one node, or --nodes 2 or more"
            )
        if network_gbps is not None:
            raise ValueError("--network-gbps sets the link between nodes; give --nodes 2 or more, or drop it")
        node_link = (intra_node or interconnect or gpu_type.link).lower()
        network = None
    else:
        if interconnect in NODE_LINKS:
            raise ValueError(
                f"with --nodes {nodes}, --interconnect names the network between nodes: give ethernet or "
                f"infiniband (and --intra-node {interconnect} for the link inside a node)"
            )
        node_link = (intra_node or gpu_type.link).lower()
        network = _network(interconnect or "infiniband", network_gbps)
    if node_link == "nvlink" and not gpu_type.nvlink_gbs:
        raise ValueError(f"{gpu_type.name} has no NVLink; use --interconnect pcie")
    if node_link == "nvlink":
        intra = Link(name="nvlink", gbs=gpu_type.nvlink_gbs, latency_s=INTRA_LATENCY_S, source=gpu_type.source)
        cross_socket = None
    else:
        intra, cross_socket = PCIE, PCIE_CROSS_SOCKET
    return Cluster(
        gpu=gpu_type,
        gpus=gpus,
        nodes=nodes,
        memory_gib=gpu_type.memory_gib if gpu_mem is None else float(gpu_mem),
        intra=intra,
        cross_socket=cross_socket,
        inter=network,
    )


CPU = GpuType(name="cpu", bf16_tflops=0.1, memory_gib=64.0, link="pcie",
              source="assumed: a CPU's throughput comes from a calibration profile (`gen plan --calibrate`)")
"""A CPU machine running ranks under gloo, as `gen run` does without GPUs (tests, benchmarks)."""
GLOO = Link(name="gloo", gbs=1.0, latency_s=50e-6,
            source="assumed: gloo over loopback TCP between processes of one machine; calibrate to measure it")


def cpu_cluster(ranks: int) -> Cluster:
    """One CPU machine running `ranks` processes that talk over gloo."""
    if ranks < 1:
        raise ValueError(f"ranks {ranks} must be at least 1")
    return Cluster(gpu=CPU, gpus=ranks, nodes=1, memory_gib=CPU.memory_gib, intra=GLOO, cross_socket=None, inter=None)
