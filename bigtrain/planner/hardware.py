"""Hardware the planner plans for: a table of known GPUs, memory-size parsing, and detection.

Pure Python: detection imports torch lazily and never ``torch.distributed``.

Sources of the table (vendor datasheets; dense, i.e. without 2:4 sparsity):
- H100 SXM5 / H200 SXM: 989 TFLOP/s bf16, NVLink 4 at 900 GB/s per GPU (both directions, 450 each way), paired with
  one 400 Gb/s NDR InfiniBand NIC per GPU (50 GB/s) in DGX/HGX systems; PCIe Gen5 x16 64 GB/s.
- A100 SXM4 40/80 GB: 312 TFLOP/s bf16, NVLink 3 at 600 GB/s (300 each way), 200 Gb/s HDR per GPU (25 GB/s) in
  DGX A100; PCIe Gen4 x16 32 GB/s.
- B200: 2250 TFLOP/s bf16 dense, NVLink 5 at 1.8 TB/s (900 each way), 800 Gb/s per GPU (100 GB/s).
- L40S: 362 TFLOP/s bf16 dense, L4: 121, A10G: 125 (dense halves of the sparse figures), RTX 4090: 165 (fp32 accum);
  no NVLink: peers talk over PCIe Gen4 (32 GB/s); 100 Gb/s Ethernet between nodes (12.5 GB/s) is assumed.
- V100 SXM2 32 GB: 125 TFLOP/s fp16 tensor cores (no bf16), NVLink 2 at 300 GB/s (150 each way).
- Memory bandwidth (HBM or GDDR, GB/s): H100 SXM 3350, H200 4800, B200 8000, A100 80 GB 2039, 40 GB 1555, L40S 864,
  L4 300, A10G 600, RTX 4090 1008, V100 900.
- FP8 tensor cores (dense, e4m3 with fp32 accumulation, the datasheets' sparse figures halved): H100 / H200 1979,
  B200 4500, L40S 733, L4 242, RTX 4090 330; none on A100, A10G, V100 (compute capability below 8.9).
Memory is the usable capacity torch reports (``torch.cuda.mem_get_info`` total), in GiB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from bigtrain.errors import ConfigError

GiB = 1024**3


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: int  # usable device memory
    peak_tflops: float  # dense bf16/fp16 tensor-core peak
    intra_node_gbps: float  # GB/s each way between two GPUs of one node (NVLink or PCIe)
    inter_node_gbps: float  # GB/s each way per GPU between nodes (the NIC per GPU)
    pcie_gbps: float  # GB/s host <-> device, for offload
    # (dtype, tokens m, TFLOP/s) measured by ``bigtrain probe`` (planner/profile.py); empty: datasheet assumptions
    measured_tflops: tuple[tuple[str, int, float], ...] = ()
    # memory bandwidth (GB/s, read + write) measured by ``bigtrain probe``; 0: unknown (the datasheet path of the
    # time model folds element-wise work into its achievable fraction instead)
    copy_gbps: float = 0.0
    # whether collectives run beside compute: GPUs have copy engines and NCCL's own SMs; on a CPU host gloo runs on
    # the cores that compute, so its time adds to the step
    overlaps_comm: bool = True
    # seconds of launch and dispatch per operator: the floor of a step however small the model (a CUDA kernel
    # launch plus PyTorch's eager dispatch is ~5 us)
    op_overhead_s: float = 5e-6
    # datasheet memory bandwidth (GB/s): the rate of streaming element-wise work without a probe (QLoRA's
    # dequantisation)
    memory_gbps: float = 2000.0
    # dense FP8 tensor-core peak (TFLOP/s); 0: the GPU has no FP8 matmul (train.fp8 cannot run on it)
    fp8_tflops: float = 0.0
    # seconds a small collective takes whatever its size, in a node: NCCL's all-reduce of a few KiB over NVLink or
    # PCIe is ~10-30 us (nccl-tests' small-message rows); an assumption until ``bigtrain probe --nproc N`` fits it
    link_latency_s: float = 20e-6
    # (m, k, n, TFLOP/s) of bf16 products at the shapes tensor parallelism cuts a block's projections into, measured
    # by ``bigtrain probe`` on GPUs; empty: tp's smaller matmuls are taken to run at the whole ones' rate
    projection_tflops: tuple[tuple[int, int, int, float], ...] = ()
    # seconds per decoder block and micro-step that tp's DTensor machinery adds (without, with sequence
    # parallelism), measured by ``bigtrain probe`` (probe_tp.py); None: TP_DISPATCH_OPS_PER_BLOCK operators at
    # op_overhead_s (cost.py / tp_time.py)
    tp_block_overhead_s: tuple[float, float] | None = None
    # seconds the host spends per forward of transformers' generate loop (fixed, per block), measured by ``bigtrain
    # probe`` (probe_decode.py); None: the operator floor (rollout_time.py)
    decode_step_s: tuple[float, float] | None = None


KNOWN_GPUS: dict[str, GPU] = {
    g.name: g
    for g in [
        GPU("H100", int(79.1 * GiB), 989.0, 450.0, 50.0, 64.0, memory_gbps=3350.0, fp8_tflops=1979.0),
        GPU("H200", int(139.8 * GiB), 989.0, 450.0, 50.0, 64.0, memory_gbps=4800.0, fp8_tflops=1979.0),
        GPU("B200", int(178.0 * GiB), 2250.0, 900.0, 100.0, 64.0, memory_gbps=8000.0, fp8_tflops=4500.0),
        GPU("A100-80GB", int(79.2 * GiB), 312.0, 300.0, 25.0, 32.0, memory_gbps=2039.0),
        GPU("A100-40GB", int(39.4 * GiB), 312.0, 300.0, 25.0, 32.0, memory_gbps=1555.0),
        GPU("L40S", int(44.4 * GiB), 362.0, 32.0, 12.5, 32.0, memory_gbps=864.0, fp8_tflops=733.0),
        GPU("L4", int(22.0 * GiB), 121.0, 32.0, 12.5, 32.0, memory_gbps=300.0, fp8_tflops=242.0),
        GPU("A10G", int(22.0 * GiB), 125.0, 32.0, 12.5, 32.0, memory_gbps=600.0),
        GPU("RTX4090", int(23.6 * GiB), 165.0, 32.0, 12.5, 32.0, memory_gbps=1008.0, fp8_tflops=330.0),
        GPU("V100-32GB", int(31.7 * GiB), 125.0, 150.0, 12.5, 16.0, memory_gbps=900.0),
    ]
}
ALIASES = {"H100-80GB": "H100", "H100-SXM": "H100", "A100": "A100-80GB", "V100": "V100-32GB", "4090": "RTX4090"}


def size(n: float, digits: int = 1) -> str:
    """Bytes in binary units a person reads: 79.3 GiB, 512.0 MiB, 3.0 KiB (``digits`` after the point)."""
    return _size(n, digits)


def sizes_apart(a: float, b: float) -> tuple[str, str]:
    """``size`` of two amounts, with as many more digits as it takes for different amounts to read differently
    (79.14 GiB > 79.06 GiB, not 79.1 GiB > 79.1 GiB)."""
    for digits in (1, 2, 3):
        shown = (_size(a, digits), _size(b, digits))
        if a == b or shown[0] != shown[1]:
            return shown
    return shown


def _size(n: float, digits: int) -> str:
    for unit, scale in (("TiB", 1024**4), ("GiB", GiB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:.0f} B"


def count(n: float) -> str:
    """A parameter count: 8.03B, 12.4M, 45.2K."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _normalise(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip()).upper()


def lookup_gpu(name: str, shown_as: str = "--gpu") -> GPU:
    """A GPU of the table by name (case-insensitive; 'NVIDIA H100 80GB HBM3' style device names work too);
    ``shown_as``: how the caller's input is named in the error (a flag, or a Python argument)."""
    key = _normalise(name).removeprefix("NVIDIA-")
    table = {_normalise(k): v for k, v in KNOWN_GPUS.items()}
    table.update({_normalise(k): KNOWN_GPUS[v] for k, v in ALIASES.items()})
    if key in table:
        return table[key]
    # device names as torch reports them: pick the longest table name contained in it ('A100-SXM4-80GB' -> A100-80GB)
    for known in sorted(table, key=len, reverse=True):
        family, _, size = known.partition("-")
        if family in key and (not size or size in key):
            return table[known]
    flag = shown_as.startswith("--")
    shown = f"{shown_as} {name!r}" if flag else f"{shown_as}={name!r}"
    memory = "--gpu-memory" if flag else "gpu_memory"
    raise ConfigError(f"{shown} is not a known GPU; use one of {', '.join(KNOWN_GPUS)} or give {memory}")


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


def parse_memory(text: str, flag: str = "--gpu-memory") -> int:
    """'80GB', '80GiB', '80G' or '1024B' -> bytes (a bare number is refused: 80 bytes is never meant). Units are
    binary (80GB = 80 GiB), as GPU vendors' 'GB' are: an "80 GB" H100 has 80 GiB of HBM, of which torch sees about
    79.1 GiB."""
    m = _SIZE.match(str(text))
    shown = f"{flag} {text!r}" if flag.startswith("--") else f"{flag}={text!r}"  # a flag, or a Python argument
    if not m:
        raise ConfigError(f"{shown} is not a size; write e.g. 80GB, 79.6GiB or 24G")
    if m.group(2) is None:  # "80" is far likelier to mean 80 GB than 80 bytes: ask instead of guessing
        raise ConfigError(f"{shown} has no unit; write e.g. {text}GB (or {text}B for bytes)")
    value, unit = float(m.group(1)), m.group(2).upper()
    if value <= 0:
        raise ConfigError(f"{shown} must be more than 0")
    powers = {"K": 1, "M": 2, "G": 3, "T": 4}
    if unit == "B":
        return int(value)
    return int(value * 1024 ** powers[unit[0]])


# host memory per GPU when none is given: DGX/HGX H100 and H200 nodes have 2 TiB for 8 GPUs
HOST_BYTES_PER_GPU = 256 * GiB


@dataclass(frozen=True)
class ReplicaLink:
    """A slow link between equal groups of the cluster's GPUs (sites, or nodes on plain Ethernet), as the user gave
    it (``--sites 2 --site-bandwidth 10Gb/s --site-latency 30ms``, or ``--inter-node-bandwidth 100Gb/s``). A
    collective among GPUs of different groups goes over it; all GPUs of a group share its bandwidth."""

    groups: int  # how many groups it joins
    bytes_per_s: float  # what one group can send over it (each way)
    latency_s: float  # one message's one-way delay
    said: str  # as the user gave it, for the table

    def per_gpu(self, num_gpus: int) -> float:
        """Bytes per second each GPU gets when every GPU of its group sends at once (data parallelism does)."""
        return self.bytes_per_s / max(1, num_gpus // self.groups)


@dataclass(frozen=True)
class Cluster:
    gpu: GPU
    num_gpus: int
    gpus_per_node: int
    host_memory_bytes: int | None = None  # host memory per node for offloaded state (None: HOST_BYTES_PER_GPU each)
    replica_link: ReplicaLink | None = None  # a slow link between groups of GPUs (None: the GPU table's links)

    @property
    def host_bytes_per_node(self) -> int:
        if self.host_memory_bytes is not None:
            return self.host_memory_bytes
        return HOST_BYTES_PER_GPU * min(self.gpus_per_node, self.num_gpus)

    @property
    def num_nodes(self) -> int:
        return -(-self.num_gpus // self.gpus_per_node)

    def spans_link(self, group: int, stride: int) -> bool:
        """Whether ``group`` ranks ``stride`` apart (the mesh's row-major order) reach over the slow link."""
        link = self.replica_link
        return link is not None and group > 1 and group * stride > self.num_gpus // link.groups


def link_bandwidth(cluster: Cluster, group: int, stride: int) -> float:
    """Bytes per second each way for ``group`` ranks ``stride`` apart in rank order: the slow link's share per GPU
    where they reach over it, else NVLink/PCIe within a node and the NIC between nodes."""
    if cluster.spans_link(group, stride):
        assert cluster.replica_link is not None
        return cluster.replica_link.per_gpu(cluster.num_gpus)
    spans_nodes = group * stride > cluster.gpus_per_node or stride >= cluster.gpus_per_node
    return (cluster.gpu.inter_node_gbps if spans_nodes and group > 1 else cluster.gpu.intra_node_gbps) * 1e9


def link_delay(cluster: Cluster, group: int, stride: int) -> float:
    """One message's delay among ``group`` ranks ``stride`` apart: the slow link's where they reach over it."""
    if cluster.spans_link(group, stride):
        assert cluster.replica_link is not None
        return cluster.replica_link.latency_s
    return cluster.gpu.link_latency_s


def ring_share(n: int) -> float:
    """The share of a collective's data each of ``n`` ranks sends over its link in a ring ((n - 1) / n; none alone)."""
    return (n - 1) / n if n > 1 else 0.0


def make_cluster(
    num_gpus: int,
    gpus_per_node: int | None = None,
    gpu_name: str | None = None,
    gpu_memory: str | int | None = None,
    host_memory: str | None = None,
) -> Cluster:
    """A cluster from flags; the GPU defaults to H100, ``gpu_memory`` overrides the table's capacity and
    ``host_memory`` (per node) the HOST_BYTES_PER_GPU assumption."""
    if num_gpus < 1:
        raise ConfigError(f"--gpus {num_gpus} must be at least 1")
    gpu = lookup_gpu(gpu_name or "H100")
    if gpu_memory is not None:
        gpu = replace(gpu, memory_bytes=gpu_memory if isinstance(gpu_memory, int) else parse_memory(gpu_memory))
        if gpu_name is None:  # named as the user gave it: the memory is theirs, the speeds an assumption
            gpu = replace(gpu, name="GPU with H100 speeds")
    per_node = gpus_per_node or min(num_gpus, 8)
    if per_node < 1:
        raise ConfigError(f"--gpus-per-node {per_node} must be at least 1")
    host = parse_memory(host_memory, "--host-memory") if host_memory is not None else None
    return Cluster(gpu=gpu, num_gpus=num_gpus, gpus_per_node=per_node, host_memory_bytes=host)


def detect_local() -> tuple[str | None, int, int | None]:
    """(device name, GPU count, smallest free memory in bytes) of this host; (None, 0, None) without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None, 0, None
    count = torch.cuda.device_count()
    free = min(torch.cuda.mem_get_info(i)[0] for i in range(count))
    return torch.cuda.get_device_name(0), count, free


_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(b|B)(?:/s|ps)\s*$")
_DELAY = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|ms|us|µs|ns)\s*$")


def parse_bandwidth(text: str, flag: str) -> float:
    """'10Gb/s', '100Gbps' (bits) or '12.5GB/s' (bytes) -> bytes per second (decimal units, as links are sold)."""
    m = _RATE.match(str(text))
    if not m:
        raise ConfigError(f"{flag} {text!r} is not a bandwidth; write e.g. 10Gb/s, 100Gbps or 12.5GB/s")
    value = float(m.group(1)) * 1000 ** " KMGT".index(m.group(2) or " ")
    if value <= 0:
        raise ConfigError(f"{flag} {text!r} must be more than 0")
    return value / 8 if m.group(3) == "b" else value


def parse_latency(text: str, flag: str) -> float:
    """'30ms', '5us', '0.03s' -> seconds."""
    m = _DELAY.match(str(text))
    if not m:
        raise ConfigError(f"{flag} {text!r} is not a delay; write e.g. 30ms, 10us or 0.03s")
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}[m.group(2)]
    return float(m.group(1)) * scale


# one-way delay assumed between nodes on Ethernet when --inter-node-bandwidth is given without a latency
ETHERNET_LATENCY_S = 25e-6


def replica_link_of(
    num_gpus: int,
    gpus_per_node: int,
    inter_node_bandwidth: str | None = None,
    inter_node_latency: str | None = None,
    sites: int | None = None,
    site_bandwidth: str | None = None,
    site_latency: str | None = None,
    spell: Any = None,
) -> ReplicaLink | None:
    """The slow link the arguments describe (sites win over nodes), or None without any."""
    name = spell or (lambda key: "--" + key.replace("_", "-"))
    shown = spell.value if spell else (lambda key, value: f"{name(key)} {value}")
    if sites is not None or site_bandwidth is not None or site_latency is not None:
        if sites is None or site_bandwidth is None:
            raise ConfigError(f"{name('sites')} and {name('site_bandwidth')} go together (and {name('site_latency')})")
        if sites < 2 or num_gpus % sites:
            raise ConfigError(
                f"{shown('sites', sites)} must be at least 2 and divide the {num_gpus} GPUs (each site holds as many)"
            )
        rate = parse_bandwidth(site_bandwidth, name("site_bandwidth"))
        delay = parse_latency(site_latency, name("site_latency")) if site_latency else 0.0
        said = f"{sites} sites of {num_gpus // sites} GPUs, {site_bandwidth} between them" + (
            f", {site_latency}" if site_latency else ""
        )
        return ReplicaLink(sites, rate, delay, said)
    if inter_node_bandwidth is None:
        if inter_node_latency is not None:
            raise ConfigError(f"{name('inter_node_latency')} needs {name('inter_node_bandwidth')}")
        return None
    nodes = -(-num_gpus // gpus_per_node)
    rate = parse_bandwidth(inter_node_bandwidth, name("inter_node_bandwidth"))
    delay = parse_latency(inter_node_latency, name("inter_node_latency")) if inter_node_latency else ETHERNET_LATENCY_S
    said = f"{nodes} nodes, {inter_node_bandwidth} per node between them, {delay * 1e6:.0f} us"
    return ReplicaLink(nodes, rate, delay, said)
