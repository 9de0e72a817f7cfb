"""Discrete-event simulator of the parallel strategies (adaptive, sync, a static split, the fastest device alone) for
2 to 64 workers.

It drives the scheduler's real code (:mod:`rsnet.parallel.batching`: claims through ``IntervalClaimer`` over a
simulated store, the claiming rule, the speed estimate, the batch-size controller,
``fit_total``, ``static_batches``; called through the module, so a test can replace one; and the
:class:`~rsnet.parallel.schedule.Schedule` every adaptive worker moves on after a merge: B, sizes, cadence,
admission) with cost models in place of devices:

* a worker's step on b samples takes t(b) = a + c·b seconds (:class:`DeviceProfile`); a simulated slowdown s
  multiplies a and c (the real one sleeps (s − 1) × the step's compute time after every step);
* every worker first times its step in a speed probe (a first step with the device's one-time costs, then timed
  ones) on a thread of its own; the run starts when every probe is done or a grace of a few steps of the first one
  done has passed, and a worker whose probe ends later is pending until the first merge after it
  (``Schedule.start``, admission);
* every store call (a claim, or a read of the counter) costs one round trip; as in training with ``prefetch: true``,
  a worker claims its next batch when it starts the current one where
  :func:`~rsnet.parallel.batching.may_claim_ahead` allows, else when the current one is done (if at all);
* an all-reduce of n bytes over W workers costs 2(W − 1)/W · n / bandwidth + W · latency per bucket (a ring over
  the slowest :class:`Link`); computation and communication never overlap (DDP overlaps its gradient all-reduce
  with the backward pass, so sync's figures here are a lower bound);
* a merge interval ends when the last worker finishes its last batch; everyone waits for it, then merges.

The run is deterministic: no noise is added to the step times.

The package: :mod:`.costs` (devices, links, models and what communication costs), :mod:`.scenario` (what is
simulated and what a run reports), :mod:`.runs` (the strategies and their comparison), :mod:`.membership` (a run
whose devices change).
"""

from __future__ import annotations

from .costs import (
    A100, COMM_SHARE_TARGET, CPU_RESNET18_64, CPU_RESNET50_224, DDP_BUCKET_BYTES, ETHERNET_10G, GPU_STEP_OVERHEAD_S,
    INFINIBAND, LOOPBACK, LOOPBACK_2_CORES, NVLINK, RESNET18_21, RESNET50, STORE_RTT_LAN_S, STORE_RTT_LOCAL_S,
    TEST_RESNET_21, V100, DeviceProfile, Link, ModelSpec, bucketed_allreduce_seconds, comm_threshold_interval,
    fit_profile, gpu_profile, gradient_allreduce_seconds, merge_seconds, ring_allreduce_seconds,
)
from .scenario import (
    RunResult, Scenario, SimSettings, SimStore, build_scenario, update_balance,
)
from .membership import Change, MembershipRun, simulate_membership
from .runs import (
    Comparison, compare, cosine_lr_ratio, physical_limit, simulate_adaptive, simulate_local_sgd, simulate_single,
    simulate_static, simulate_sync, speed_probes, static_split,
)

__all__ = [  # the simulator's API, as before it was split into modules
    "A100", "COMM_SHARE_TARGET", "CPU_RESNET18_64", "CPU_RESNET50_224", "Change", "Comparison", "DDP_BUCKET_BYTES",
    "DeviceProfile", "ETHERNET_10G", "GPU_STEP_OVERHEAD_S", "INFINIBAND", "LOOPBACK", "LOOPBACK_2_CORES", "Link",
    "MembershipRun", "ModelSpec", "NVLINK", "RESNET18_21", "RESNET50", "RunResult", "STORE_RTT_LAN_S",
    "STORE_RTT_LOCAL_S", "Scenario", "SimSettings", "SimStore", "TEST_RESNET_21", "V100",
    "bucketed_allreduce_seconds", "build_scenario", "comm_threshold_interval", "compare", "cosine_lr_ratio",
    "fit_profile", "gpu_profile", "gradient_allreduce_seconds", "merge_seconds", "physical_limit",
    "ring_allreduce_seconds", "simulate_adaptive", "simulate_local_sgd", "simulate_membership", "simulate_single",
    "simulate_static", "simulate_sync", "speed_probes", "static_split", "update_balance",
]
