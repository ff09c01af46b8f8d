"""Hardware catalog: GPUs and interconnects, from vendor datasheets (docs/formulas.md, "Hardware").

Bandwidths are bytes per second. NVLink figures are a GPU's total NVLink bandwidth (both
directions), as NVIDIA quotes them; an InfiniBand port's figure is its signalling rate per
direction (HDR 200 Gb/s, NDR 400 Gb/s), and a DGX-class node has 8 compute ports, one per GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from paracube.errors import ConfigError

GB = 1e9


@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float  # dense bf16/fp16 tensor-core FLOP/s, at the boost clock
    memory_bytes: float
    hbm_bandwidth: float  # bytes/s
    nvlink_bandwidth: float  # bytes/s per GPU, all links, both directions
    base_mhz: float = 0.0  # datasheet base clock: what the GPU guarantees under sustained load
    boost_mhz: float = 0.0  # datasheet boost clock: the one the peak FLOP/s figure assumes
    # GPUs move data with DMA engines / a few SMs while the rest compute; CPU ranks reduce
    # and copy with the very cores that compute, so there nothing is hidden.
    overlaps_communication: bool = True
    # FLOP/s of the fused attention kernel where it differs from the tensor-core rate (measured
    # by `plan --calibrate` on a CPU; 0: the sustained tensor-core rate, as FlashAttention's)
    attention_rate: float = 0.0
    # FLOP/s of its backward where it differs from the forward's (a calibrated GPU measures
    # both: on an H200 torch's SDPA ran its backward at 351 against 526 forward); 0: the same
    attention_backward_rate: float = 0.0
    # elements/s of the MLP nonlinearity (forward, backward) where it is compute-bound (measured
    # on a CPU; (0, 0): a GPU's fused kernel, memory-bound, counted with the element-wise traffic)
    activation_rates: tuple[float, float] = (0.0, 0.0)
    sms: int = (
        0  # streaming multiprocessors: a GEMM runs in waves of one output tile per SM (0: no waves)
    )
    # --offload optimizer: the GPU's host link (PCIe, one direction) and its share of the
    # host's memory bandwidth, where the CPU steps Adam (0: nothing to offload to)
    host_link_bandwidth: float = 0.0
    host_memory_bandwidth: float = 0.0
    host_memory_bytes: float = 0.0  # the node's RAM over its GPUs: what offloaded states may use
    # fp32 on the CUDA cores (torch's default for fp32 matmuls: TF32 off) and TF32 on the
    # tensor cores (``torch.backends.cuda.matmul.allow_tf32``), dense, at the boost clock;
    # 0: the same as ``peak_flops`` (a calibrated CPU measures its one fp32 rate)
    fp32_flops: float = 0.0
    tf32_flops: float = 0.0
    # FP8 (E4M3/E5M2) on the tensor cores, dense, at the boost clock (0: no FP8 units)
    fp8_flops: float = 0.0
    # measured fraction of ``fp8_flops`` FP8 matmuls sustain (0: ``sustained_fraction``)
    measured_fp8_sustained: float = 0.0
    # measured fraction of the peak a GPU sustains on large matmuls at its power limit with
    # every GPU of the node busy (0: derive it from the clocks, base ÷ boost)
    measured_sustained: float = 0.0
    # measured fraction of ``hbm_bandwidth`` a streaming kernel moves (0: the datasheet's)
    measured_hbm: float = 0.0
    # the tensor cores take bfloat16: Ampere and later ("BF16 ... new in A100", the NVIDIA
    # A100 Tensor Core GPU Architecture whitepaper); Volta's take fp16 only
    bf16: bool = True

    @property
    def memory_rate(self) -> float:
        """Bytes/s the memory-bound work moves (element-wise passes, the loss, the optimizer,
        the GEMMs' roofline): the datasheet's HBM bandwidth at the measured fraction a
        streaming kernel reaches where one is known (:data:`HBM_ACHIEVED`)."""
        return self.hbm_bandwidth * (self.measured_hbm or 1.0)

    def rate(self, precision: str) -> float:
        """Peak FLOP/s of the units a ``precision`` run's matmuls use: bf16/fp16 tensor
        cores, fp32 CUDA cores, or TF32 tensor cores (the planner's ``tf32``)."""
        if precision == "fp32":
            return self.fp32_flops or self.peak_flops
        if precision == "tf32":
            return self.tf32_flops or self.fp32_flops or self.peak_flops
        # fp8: attention, the head and the norms run in bf16; only the blocks' linear
        # layers take ``fp8_flops`` (time_model.layer_time); MFU counts against fp8_flops
        return self.peak_flops

    @property
    def fp8_units(self) -> GPU:
        """This GPU as its FP8 matmuls see it: the FP8 peak at the fraction FP8 matmuls
        sustain (:data:`HOPPER_FP8_SUSTAINED`), everything else the same."""
        return replace(
            self,
            peak_flops=self.fp8_flops,
            measured_sustained=self.measured_fp8_sustained or self.sustained_fraction,
        )

    @property
    def sustained_fraction(self) -> float:
        """The fraction of the peak the tensor cores sustain through a training run: a
        measurement at the power limit where one is published (Hopper), else the peak at
        the base clock over the peak at boost — all a GPU guarantees at full power draw."""
        if self.measured_sustained:
            return self.measured_sustained
        return self.base_mhz / self.boost_mhz if self.boost_mhz else 1.0


@dataclass(frozen=True)
class Interconnect:
    name: str
    bandwidth: float  # bytes/s per GPU, one direction
    latency: float  # seconds per message (α of the α-β model)
    # What an all-gather + reduce-scatter pair costs relative to the all-reduce it replaces
    # (sequence parallelism). 1 for NCCL, whose ring all-reduce is exactly that pair
    # (docs/formulas.md); measured by `paracube plan --calibrate` for gloo on this machine.
    pair_cost_ratio: float = 1.0
    # True: ``bandwidth`` is one NIC shared by the node's GPUs (Ethernet), so each GPU gets
    # bandwidth ÷ GPUs per node (the Cluster divides it); False: per GPU (a rail each)
    shared_by_node: bool = False
    # An all-reduce's bus bandwidth where the fabric reduces in the switch (NVLink SHARP,
    # NCCL's NVLS algorithm on H100/H200 NVSwitch nodes); None: a ring at ``bandwidth``
    allreduce_bandwidth: float | None = None


# Host side, for --offload: PCIe per direction — Gen3 x16 16 GB/s (V100), Gen4 x16 32 GB/s
# (A100), Gen5 x16 64 GB/s (H100/H200); host memory bandwidth per GPU in the DGX servers of
# each generation — DGX-1: 2 × 4 channels DDR4-2400 = 154 GB/s over 8 GPUs; DGX A100:
# 2 × 8 channels DDR4-3200 = 410 GB/s over 8; DGX H100/H200: 2 × 8 channels DDR5-4800 =
# 614 GB/s over 8 (the vendors' system and CPU datasheets).
PCIE = {"v100": 16 * GB, "a100": 32 * GB, "h100": 64 * GB}
HOST_MEMORY = {"v100": 154 * GB / 8, "a100": 410 * GB / 8, "h100": 614 * GB / 8}
# System memory per GPU: DGX-1 512 GB, DGX A100 1 TB, DGX H100/H200 2 TB, over 8 GPUs.
HOST_RAM = {"v100": 512 * GB / 8, "a100": 1024 * GB / 8, "h100": 2048 * GB / 8}

# FlashAttention-2 on Hopper: "only 35% utilization on the H100 GPU" (Shah et al. 2024,
# FlashAttention-3, abstract) — it does not use Hopper's asynchronous tensor-core and TMA
# instructions; FLOPs counted as executed (the causal half). On Ampere: "50–73% of the
# theoretical maximum FLOPs/s on A100" (Dao 2023, FlashAttention-2, abstract) — "up to 73%
# ... in the forward pass, and up to 63% ... in the backward pass" (§1), the maxima of its
# benchmarks over masks, head sizes and sequence lengths. One rate for both passes, the
# range's bottom, 50 %: the maxima (73/63) put llm-foundry's A100 runs at 32–64K tokens at
# 1.12–1.26 and drop the published table's count within ±15 % from 407 to 394; a forward at
# 73 % with the backward at 50 % moves those runs from ~0.88 to ~0.98 and no count — neither
# is a figure for the causal 2–8K-token kernels most runs use, so neither is taken. On
# Hopper the 35 % is FlashAttention-2's forward: the same paper's H100 benchmarks (head
# dimension 128) have its forward at 362–370 TFLOP/s from 2K to 16K tokens and its backward
# slower, 291–322 — 318 against 370 at 8K, the sequence of most of today's H100 runs, which
# its backward runs at (0.86 of the forward, as FlashAttention-2's own A100 maxima, 63/73).
FLASH2_HOPPER = 0.35 * 989e12
FLASH2_HOPPER_BACKWARD = FLASH2_HOPPER * 318 / 370
FLASH2_AMPERE = 0.50 * 312e12
# Hopper at its 700 W limit: the maximum *sustainable* matmul rate measured on an 8-GPU H200
# node with every GPU computing, 698.6 TFLOP/s mean over 40 runs at 1405–1527 MHz (Bekman,
# "Machine Learning Engineering", compute/accelerator/benchmarks, mamf-finder MSMF; the
# H100 SXM shares its silicon, clocks and power limit) — below the base-clock figure, since
# dense tensor-core work meets the power limit before the clock floor.
HOPPER_SUSTAINED = 698.6e12 / 989e12
# FP8 matmuls reach a smaller fraction of their peak than BF16 ones: on the same H100 SXM, by
# the same benchmark (mamf-finder, a mean of 100 iterations after 50 warm-up ones, torch
# 2.7.0+cu126), the best FP8 (float8_e4m3fn) matmul ran at 1,402.6 of 1,979 TFLOP/s, 70.9 %,
# and the best BF16 one at 794.5 of 989, 80.3 % (Bekman, "Machine Learning Engineering",
# compute/accelerator, "Maximum Achievable Matmul FLOPS comparison table"). The FP8 units'
# sustained fraction is the BF16 one scaled by that ratio: 62.3 % of the FP8 peak, 1,233
# TFLOP/s, 1.77× the BF16 rate rather than the 2× of the datasheets. The H200 is taken at
# the same ratio, as for the BF16 rate: the same silicon, clocks and 700 W limit (the table's
# GH200, at 900 W, reaches 1.85×).
HOPPER_FP8_SUSTAINED = HOPPER_SUSTAINED * (1402.6e12 / 1979e12) / (794.5e12 / 989e12)
# The fraction of the datasheet's HBM bandwidth a streaming kernel reaches, measured:
# H200, a device-to-device copy, 4,276 of 4,800 GB/s (paracube's GPU check, BENCHMARKS.md;
# benchmarks/results/gpu_h200/calibration.json) — H100 SXM taken at the same fraction, as
# for the matmul rate; A100 80GB, a streaming read kernel at 1.80 of 2.04 TB/s, 88 %, which
# Nsight Compute confirmed (NVIDIA developer forums, "Trouble to reach peak bandwidth of
# A100", 2025); A100 40GB, a memcpy at 1,225 of 1,448 GiB/s (GPUInspector.jl, "Data
# Bandwidth" example on a DGX A100). V100: none found, the datasheet's.
HBM_ACHIEVED = {"hopper": 4276 / 4800, "a100-80gb": 1.80 / 2.04, "a100-40gb": 1225 / 1448.4}
# What a GPU's memory holds as CUDA sees it. A datasheet's "80GB" counts binary gigabytes —
# HBM stacks hold 8, 16 or 24 GiB (A100 80GB: five 16 GiB stacks, nvidia-smi's 81,920 MiB) —
# less what the driver keeps back: our H200 ("141GB") reported 150,109,880,320 bytes to
# torch.cuda.get_device_properties().total_memory (benchmarks/results/gpu_h200/
# calibration.json), 99.15 % of 141 GiB; the other GPUs are taken at the same share. Counting
# decimal gigabytes left 6–7 % of every GPU out of the memory model.
VISIBLE_SHARE = 150_109_880_320 / (141 * 2**30)


def device_memory(datasheet_gb: float) -> float:
    """Bytes CUDA can allocate on a GPU sold as ``datasheet_gb`` GB (:data:`VISIBLE_SHARE`)."""
    return datasheet_gb * 2**30 * VISIBLE_SHARE


# fmt: off
GPUS: dict[str, GPU] = {
    # clocks (MHz): V100 SXM2 1290/1530, A100 SXM4 1095/1410, H100/H200 SXM5 1590/1980;
    # SMs (architecture whitepapers): V100 80, A100 108, H100/H200 SXM5 132
    # fp32 / TF32 dense (datasheets): V100 15.7 / — (no TF32), A100 19.5 / 156, H100/H200 SXM
    # 67 / 494.7 TFLOP/s; FP8 dense: H100/H200 SXM 1,979 TFLOP/s (3,958 "with sparsity"),
    # none on V100 and A100
    "v100": GPU("V100 SXM2 32GB", 125e12, device_memory(32), 900 * GB, 300 * GB, 1290, 1530, sms=80,
                fp32_flops=15.7e12, bf16=False,
                host_link_bandwidth=PCIE["v100"], host_memory_bandwidth=HOST_MEMORY["v100"],
                host_memory_bytes=HOST_RAM["v100"]),
    "a100-40gb": GPU("A100 40GB", 312e12, device_memory(40), 1555 * GB, 600 * GB, 1095, 1410, sms=108,
                     fp32_flops=19.5e12, tf32_flops=156e12, attention_rate=FLASH2_AMPERE,
                     measured_hbm=HBM_ACHIEVED["a100-40gb"],
                     host_link_bandwidth=PCIE["a100"], host_memory_bandwidth=HOST_MEMORY["a100"],
                host_memory_bytes=HOST_RAM["a100"]),
    "a100-80gb": GPU("A100 80GB", 312e12, device_memory(80), 2039 * GB, 600 * GB, 1095, 1410, sms=108,
                     fp32_flops=19.5e12, tf32_flops=156e12, attention_rate=FLASH2_AMPERE,
                     measured_hbm=HBM_ACHIEVED["a100-80gb"],
                     host_link_bandwidth=PCIE["a100"], host_memory_bandwidth=HOST_MEMORY["a100"],
                host_memory_bytes=HOST_RAM["a100"]),
    "h100": GPU("H100 SXM", 989e12, device_memory(80), 3350 * GB, 900 * GB, 1590, 1980, sms=132,
                fp32_flops=67e12, tf32_flops=494.7e12, fp8_flops=1979e12,
                attention_rate=FLASH2_HOPPER, attention_backward_rate=FLASH2_HOPPER_BACKWARD,
                measured_sustained=HOPPER_SUSTAINED, measured_hbm=HBM_ACHIEVED["hopper"],
                measured_fp8_sustained=HOPPER_FP8_SUSTAINED,
                host_link_bandwidth=PCIE["h100"], host_memory_bandwidth=HOST_MEMORY["h100"],
                host_memory_bytes=HOST_RAM["h100"]),
    "h200": GPU("H200 SXM", 989e12, device_memory(141), 4800 * GB, 900 * GB, 1590, 1980, sms=132,
                fp32_flops=67e12, tf32_flops=494.7e12, fp8_flops=1979e12,
                attention_rate=FLASH2_HOPPER, attention_backward_rate=FLASH2_HOPPER_BACKWARD,
                measured_sustained=HOPPER_SUSTAINED, measured_hbm=HBM_ACHIEVED["hopper"],
                measured_fp8_sustained=HOPPER_FP8_SUSTAINED,
                host_link_bandwidth=PCIE["h100"], host_memory_bandwidth=HOST_MEMORY["h100"],
                host_memory_bytes=HOST_RAM["h100"]),
}
# fmt: on
# The export variants: the same silicon, clocks and power at a lower NVLink rate — 400 GB/s
# per GPU, both directions, against A100's 600 and H100's 900 (NVIDIA's A800 and H800
# datasheets); every other figure is their A100 80GB's and H100 SXM's
GPUS["a800"] = replace(GPUS["a100-80gb"], name="A800 80GB", nvlink_bandwidth=400 * GB)
GPUS["h800"] = replace(GPUS["h100"], name="H800 SXM", nvlink_bandwidth=400 * GB)

# Meta's Grand Teton H100s, as torchtitan's benchmarks of December 2024 ran them: "96GB HBM2e
# with 2.4 TB/sec peak memory bandwidth", "the default 500W power limit", and "the actual
# peak TFLOPs number is between SXM and NVL" (pytorch/torchtitan, benchmarks/
# llama3_h100_202412_torchtitan.md). Every rate is the H100 SXM's scaled to that power:
# the datasheets' dense BF16 peaks at their power limits — H100 NVL 835 TFLOP/s at 400 W,
# H100 SXM 989 at 700 W — interpolated linearly to 500 W, 886 (their FP8 peaks, 1,671 and
# 1,979, give the same ratio: 1,774); the measured fractions (sustained matmul rate, HBM
# streaming) the SXM's.
GRAND_TETON_SCALE = (835 + (989 - 835) * (500 - 400) / (700 - 400)) / 989
_sxm = GPUS["h100"]
GPUS["h100-96gb-500w"] = replace(
    _sxm,
    name="H100 96GB HBM2e (500 W)",
    peak_flops=_sxm.peak_flops * GRAND_TETON_SCALE,
    fp32_flops=_sxm.fp32_flops * GRAND_TETON_SCALE,
    tf32_flops=_sxm.tf32_flops * GRAND_TETON_SCALE,
    fp8_flops=_sxm.fp8_flops * GRAND_TETON_SCALE,
    attention_rate=_sxm.attention_rate * GRAND_TETON_SCALE,
    attention_backward_rate=_sxm.attention_backward_rate * GRAND_TETON_SCALE,
    memory_bytes=device_memory(96),
    hbm_bandwidth=2400 * GB,
)

# One direction per GPU, at the rate NCCL's collectives move data. NVLink: the links' line
# rate is 25 GB/s each way, but NCCL's kernels carry 128-byte payloads on both directions at
# once — "the app-level bandwidth is 80% of the peak bandwidth" (NVIDIA/nccl#1054) — and its
# topology model sets an NVLink at 20 GB/s on Volta and Ampere and 20.6 on Hopper
# (src/graph/topo.h: SM70/SM80_NVLINK_BW, SM90_NVLINK_BW): V100 6 links, A100 12 ("the
# total effective bandwidth should therefore be 240GB/s on A100", NVIDIA/nccl-tests#149),
# H100 18 ("with the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of
# 370GB/s", NVIDIA/nccl-tests#212), A800 and H800 8. The network at its line rate per port
# (one per GPU), as NCCL's model takes a NIC's speed.
# Latencies, per ring step: what NCCL's own tuning model charges a step of a ring under its
# Simple protocol — the one large collectives use —, 3.4 µs over NVLink and 14 µs over the
# network (NVIDIA/nccl, src/graph/tuning.cc, ``hwLat`` Ring/Simple for NCCL_HW_NVLINK and
# NCCL_HW_NET; its per-collective ``baseLat`` of 8.4 µs is not charged); ~20 µs over
# Ethernet/TCP.
# Omni-Path (Intel OPA, 100 Gb/s per port) as Jean Zay's A100 nodes have it: "8 GPUs per node
# Using NVLink 4 inter-gpu connects, 4 OmniPath links" (bigscience-workshop/bigscience,
# train/tr11-176B-ml/README.md, BLOOM's cluster): four ports shared by eight GPUs, at
# InfiniBand's latency (the same class of RDMA fabric). RoCE, four 100 Gb/s ports per node
# of eight A100s as InternLM's scaling tests ran ("Inter-machine bandwidth: 4 * 100Gb RoCE",
# InternLM/InternLM, doc/en/train_performance.md): the same shape and latency — NCCL's
# tuning model has one network class for InfiniBand and RoCE alike (NCCL_HW_NET).
# NCCL's per-step latencies (above): a ring step over NVLink, and over an RDMA network
# (NCCL_HW_NET: InfiniBand, RoCE, Omni-Path and the networks of --inter PORTSxGBPS alike)
NVLINK_LATENCY = 3.4e-6
NETWORK_LATENCY = 14e-6
# NCCL's effective bandwidth of one NVLink, one direction (src/graph/topo.h; above)
NVLINK_EFFECTIVE = {"volta": 20.0 * GB, "ampere": 20.0 * GB, "hopper": 20.6 * GB}
# Hopper's NVSwitch reduces in the switch: "allreduce uses NVLink SHARP by default ... On 8
# GPUs, you should reach a peak busBw of ~480GB/s (algbw ~275GB/s)" (NVIDIA/nccl-tests#212,
# NCCL's maintainer, of H100's 18 links), against the 370 of its rings — the all-gathers and
# reduce-scatters. The H800's 8 links: the same per link, 480 × 8/18.
NVLS_ALLREDUCE_PER_LINK = 480 * GB / 18
INTERCONNECTS: dict[str, Interconnect] = {
    "nvlink2": Interconnect("NVLink 2 (V100)", 6 * NVLINK_EFFECTIVE["volta"], NVLINK_LATENCY),
    "nvlink3": Interconnect("NVLink 3 (A100)", 12 * NVLINK_EFFECTIVE["ampere"], NVLINK_LATENCY),
    "nvlink4": Interconnect(
        "NVLink 4 (H100/H200)",
        18 * NVLINK_EFFECTIVE["hopper"],
        NVLINK_LATENCY,
        allreduce_bandwidth=18 * NVLS_ALLREDUCE_PER_LINK,
    ),
    "nvlink-400": Interconnect(
        "NVLink 3, 400 GB/s (A800)", 8 * NVLINK_EFFECTIVE["ampere"], NVLINK_LATENCY
    ),
    "nvlink4-400": Interconnect(
        "NVLink 4, 400 GB/s (H800)",
        8 * NVLINK_EFFECTIVE["hopper"],
        NVLINK_LATENCY,
        allreduce_bandwidth=8 * NVLS_ALLREDUCE_PER_LINK,
    ),
    "ib-hdr": Interconnect("InfiniBand HDR 200 Gb/s per GPU", 25 * GB, NETWORK_LATENCY),
    "ib-ndr": Interconnect("InfiniBand NDR 400 Gb/s per GPU", 50 * GB, NETWORK_LATENCY),
    "ethernet-100g": Interconnect(
        "Ethernet 100 Gb/s per node", 12.5 * GB, 20e-6, shared_by_node=True
    ),
    "opa-4x100": Interconnect(
        "Omni-Path 4 × 100 Gb/s per node", 4 * 12.5 * GB, NETWORK_LATENCY, shared_by_node=True
    ),
    "roce-4x100": Interconnect(
        "RoCE 4 × 100 Gb/s per node", 4 * 12.5 * GB, NETWORK_LATENCY, shared_by_node=True
    ),
}

DEFAULT_INTRA = {
    "v100": "nvlink2",
    "a100-40gb": "nvlink3",
    "a100-80gb": "nvlink3",
    "a800": "nvlink-400",
    "h100": "nvlink4",
    "h800": "nvlink4-400",
    "h200": "nvlink4",
    "h100-96gb-500w": "nvlink4",
}
DEFAULT_INTER = {
    "v100": "ib-hdr",
    "a100-40gb": "ib-hdr",
    "a100-80gb": "ib-hdr",
    "a800": "ib-hdr",
    "h100": "ib-ndr",
    "h800": "ib-ndr",
    "h200": "ib-ndr",
    "h100-96gb-500w": "ib-ndr",  # "400 Gb/s per GPU" (the same benchmarks)
}


def catalog_key(device_name: str) -> str | None:
    """The catalog entry of a GPU as CUDA names it (``torch.cuda.get_device_name``:
    "NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"), None if not listed."""
    name = device_name.lower()
    for model in ("h200", "h100", "h800", "a800", "v100"):
        if model in name:
            return model
    if "a100" in name:
        return "a100-40gb" if "40gb" in name else "a100-80gb"
    return None


def default_precision(gpus: list[GPU]) -> str:
    """The precision a job on ``gpus`` trains in unless told: bf16, as Megatron-Core and FSDP
    recipes do — fp16 where one of them has no bfloat16 tensor cores (V100), as such jobs ran."""
    return "bf16" if all(g.bf16 for g in gpus) else "fp16"


def gpu(name: str) -> GPU:
    key = name.lower()
    if key not in GPUS:
        raise ConfigError(f"unknown GPU {name!r}: choose one of {', '.join(GPUS)}")
    return GPUS[key]


# A node's network the catalog does not name, as its ports and their rate in Gb/s: "4x100"
# is four 100 Gb/s ports shared by the node's GPUs — AWS p4d's and p4de's 400 Gb/s of EFA —,
# "32x100" p5's 3,200 Gb/s, "8x400" eight NDR ports, one a GPU (ib-ndr's rate); an RDMA
# network at NCCL's network latency, whose ports the GPUs share (each gets its node's
# ports × rate over its GPUs, :class:`~paracube.planner.time_model.Cluster`)
NETWORK_SPEC = re.compile(r"(\d+)x(\d+(?:\.\d+)?)")


def interconnect(name: str, network: bool = False) -> Interconnect:
    """A link of the catalog by name; for a ``network`` between nodes, also a node's ports
    and their rate (:data:`NETWORK_SPEC`).

    >>> interconnect("4x100", network=True).bandwidth == interconnect("roce-4x100").bandwidth
    True
    """
    key = name.lower()
    if key in INTERCONNECTS:
        return INTERCONNECTS[key]
    spec = NETWORK_SPEC.fullmatch(key) if network else None
    if spec and int(spec[1]) >= 1 and float(spec[2]) > 0:
        ports, gbps = int(spec[1]), float(spec[2])
        return Interconnect(
            f"{ports} × {gbps:g} Gb/s per node",
            ports * gbps / 8 * GB,
            NETWORK_LATENCY,
            shared_by_node=True,
        )
    if network:
        spec_words = ", or a node's ports × Gb/s each as PORTSxGBPS (4x100: four 100 Gb/s ports)"
    elif NETWORK_SPEC.fullmatch(key):
        spec_words = " (PORTSxGBPS is a network between nodes: give it to --inter)"
    else:
        spec_words = ""
    raise ConfigError(
        f"unknown interconnect {name!r}: choose one of {', '.join(INTERCONNECTS)}{spec_words}"
    )
