"""The simulator's cost models: a device's step time t(b) = a + c·b (:class:`DeviceProfile`, with measured and
published profiles), the all-reduce ring's slowest :class:`Link`, a model's size (:class:`ModelSpec`), and what a
merge or a gradient all-reduce costs on them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rsnet.parallel.merge import BUCKET_BYTES
from rsnet.parallel.strategies.adaptive import META_FIELDS

DDP_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel's default bucket_cap_mb
GPU_STEP_OVERHEAD_S = 0.005  # assumed fixed cost of a GPU step (launches, optimizer step, host sync) besides images
COMM_SHARE_TARGET = 0.05


@dataclass(frozen=True)
class DeviceProfile:
    """One worker's step time t(b) = a + c·b seconds, and ``first_step`` more for its first step of the run (memory
    allocation, kernel selection); ``source`` says where the figures come from."""

    name: str
    a: float
    c: float
    source: str = ""
    first_step: float = 0.0

    def step_seconds(self, batch: float) -> float:
        return self.a + self.c * batch if batch > 0 else 0.0

    def speed(self, batch: float) -> float:
        """Samples per second at batch size ``batch``."""
        return batch / self.step_seconds(batch)

    def slowed(self, factor: float) -> DeviceProfile:
        """This device with the simulated slowdown ``factor`` (``trainer.slowdown``): 1/factor of its speed."""
        return replace(self, name=f"{self.name} at 1/{factor:g}", a=self.a * factor, c=self.c * factor,
                       first_step=self.first_step * factor)


def gpu_profile(name: str, images_per_s: float, batch: int, source: str) -> DeviceProfile:
    """A GPU from a published training throughput at ``batch``: t(b) = a + c·b with the assumed overhead a
    (GPU_STEP_OVERHEAD_S) and c chosen so that t(batch) = batch / images_per_s."""
    return DeviceProfile(name, GPU_STEP_OVERHEAD_S, 1.0 / images_per_s - GPU_STEP_OVERHEAD_S / batch, source)


def fit_profile(name: str, batches: Sequence[float], seconds: Sequence[float], source: str = "") -> DeviceProfile:
    """Least-squares t(b) = a + c·b through measured step times (a is kept >= 0)."""
    mean_b, mean_t = statistics.mean(batches), statistics.mean(seconds)
    c = (sum((b - mean_b) * (t - mean_t) for b, t in zip(batches, seconds))
         / sum((b - mean_b) ** 2 for b in batches))
    return DeviceProfile(name, max(mean_t - c * mean_b, 0.0), c, source)


# Measured here on 2026-11-23 01:26 UTC with `python benchmarks/sim_scheduler.py --measure-cpu` (2 cores, otherwise
# idle at the time): the real training step (rsnet's baseline model, 21 classes, its loss, the timm SGD of
# conf/config.yaml) on random images, one torch thread, least squares over the fastest of 5 (3) steps per batch size.
CPU_RESNET18_64 = DeviceProfile("cpu resnet18 64px", a=0.03139, c=0.006819,
                                source="measured here: resnet18 at 64 px, 1 thread, batches 8/16/24/32 (2026-11-25)")
CPU_RESNET50_224 = DeviceProfile("cpu resnet50 224px", a=0.1204, c=0.4227,
                                 source="measured here: resnet50 at 224 px, 1 thread, batches 1/2/3/4")
STORE_RTT_LOCAL_S = 22e-6  # measured here: median round trip of TCPStore.add on 127.0.0.1
STORE_RTT_LAN_S = 200e-6  # assumed: the store on another host of the cluster's network

# ResNet-50 v1.5 training, 1 GPU, mixed precision, batch 256: NVIDIA DeepLearningExamples,
# PyTorch/Classification/ConvNets/resnet50v1.5/README.md, "Training performance results" (pytorch-21.03 NGC
# container): DGX A100 80GB 2470 img/s, DGX-1 V100 16GB 1200 img/s.
_NVIDIA_RN50 = "NVIDIA DeepLearningExamples resnet50v1.5 PyTorch README, AMP, batch 256"
A100 = gpu_profile("A100", 2470, 256, f"{_NVIDIA_RN50}: 2470 img/s")
V100 = gpu_profile("V100", 1200, 256, f"{_NVIDIA_RN50}: 1200 img/s")


@dataclass(frozen=True)
class Link:
    """The slowest link of the all-reduce ring: bandwidth in bytes/s (per direction), latency per hop in s."""

    name: str
    bandwidth: float
    latency: float


# Assumptions (not measured here): effective all-reduce bandwidths, below the links' nominal rates.
NVLINK = Link("NVLink in one 8-GPU node", 200e9, 10e-6)
INFINIBAND = Link("100 Gb/s InfiniBand between nodes", 12.5e9, 5e-6)
ETHERNET_10G = Link("10 Gb/s Ethernet between hosts", 1.25e9, 50e-6)
LOOPBACK = Link("gloo over TCP on one host", 2e9, 50e-6)
# Measured here on 2026-11-23 07:13 UTC with `python benchmarks/sim_scheduler.py --measure-cpu` (measure_loopback):
# 2 gloo processes with one torch thread each on the 2-core development host, median all-reduce of 1 / 4 / 12 / 25 MiB
# in 1.4 / 4.8 / 10.2 / 21.5 ms, least squares. The validations against the benchmarks run there use it; LOOPBACK
# stays the assumption for a host with cores to spare.
LOOPBACK_2_CORES = Link("gloo, 2 processes on the 2-core development host", 2.47e9, 423e-6)


def ring_allreduce_seconds(nbytes: float, world: int, link: Link) -> float:
    """One ring all-reduce of ``nbytes``: 2(W − 1)/W · nbytes / bandwidth + W · latency (0 for one worker)."""
    if world <= 1:
        return 0.0
    return 2 * (world - 1) / world * nbytes / link.bandwidth + world * link.latency


def bucketed_allreduce_seconds(nbytes: float, world: int, link: Link, bucket_bytes: int) -> float:
    """All-reduces of ``nbytes`` cut into buckets of at most ``bucket_bytes``, one after the other."""
    full, rest = divmod(int(nbytes), bucket_bytes)
    buckets = [bucket_bytes] * full + ([rest] if rest else [])
    return sum(ring_allreduce_seconds(size, world, link) for size in buckets)


@dataclass(frozen=True)
class ModelSpec:
    """What a model sends: float32 parameters and floating buffers (merged), integer buffers (in the header)."""

    name: str
    params: int
    float_buffers: int
    int_buffers: int

    @property
    def merge_bytes(self) -> int:
        return 4 * (self.params + self.float_buffers)

    @property
    def gradient_bytes(self) -> int:
        return 4 * self.params


# Counted with timm 1.0.31: the ImageNet models (1000 classes) that the GPU figures are for, and rsnet's baseline
# (backbone, pooling, linear head) with the 21 classes of UC Merced.
RESNET50 = ModelSpec("resnet50 (1000 classes)", 25_557_032, 53_120, 53)
RESNET18_21 = ModelSpec("baseline resnet18 (21 classes)", 11_187_285, 9_600, 20)
TEST_RESNET_21 = ModelSpec("baseline test_resnet (21 classes)", 374_725, 2_080, 15)


def merge_seconds(model: ModelSpec, world: int, link: Link, tensors: bool = True) -> float:
    """One normalized merge (rsnet.parallel.merge): the float64 header (weight, count, the per-worker meta table,
    integer buffers), then (``tensors``) the parameters and floating buffers in buckets of at most
    merge.BUCKET_BYTES."""
    header = 8 * (2 + len(META_FIELDS) * world + model.int_buffers)
    return (ring_allreduce_seconds(header, world, link)
            + (bucketed_allreduce_seconds(model.merge_bytes, world, link, BUCKET_BYTES) if tensors else 0.0))


def gradient_allreduce_seconds(model: ModelSpec, world: int, link: Link) -> float:
    """DDP's all-reduce of the gradients of one step (buckets of DDP_BUCKET_BYTES)."""
    return bucketed_allreduce_seconds(model.gradient_bytes, world, link, DDP_BUCKET_BYTES)


def comm_threshold_interval(merge_s: float, rate: float, share: float = COMM_SHARE_TARGET) -> int:
    """The smallest merge interval M (samples) whose merge takes less than ``share`` of the wall time when the
    workers together train ``rate`` samples/s between merges: merge_s / (M / rate + merge_s) < share."""
    return math.floor(merge_s * rate * (1 - share) / share) + 1


