"""Started by torchrun: the worker's store on the rendezvous endpoint, and scripts/train.py end to end.

The store tests run one worker in this process with the environment torchrun (or a user, or SLURM)
would set; the end-to-end test runs two torchrun agents as two nodes of one machine (``--nnodes=2``, c10d
rendezvous on 127.0.0.1) that train and resume.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from helpers import wait_for

from rsnet.parallel import WorkerContext, launch
from rsnet.parallel.launcher import agree_backend

REPO = Path(__file__).resolve().parent.parent
TINY = ["trainer.devices=[cpu,cpu]", "trainer.cpu_threads=1", "trainer.timeout_s=60", "backbone=test_resnet",
        "model=baseline", "dataset.image_size=32", "epochs=1", "log.progress_bar=false"]
RUN_TIMEOUT_S = 300
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
TORCHRUN_ENV = ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


# ------------------------------------------------------------------------------ the store, in process


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _claim_and_read_raw_key(ctx: WorkerContext, raw_key: str) -> tuple[int, int]:
    """Claim 3 through the worker's store; return the counter and ``raw_key`` read without any prefix."""
    count = ctx.store.add("claims", 3)
    raw = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                        timeout=datetime.timedelta(seconds=30))
    return count, int(raw.get(raw_key))


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch) -> int:
    """The environment of rank 0 in a world of 1 on a free MASTER_PORT (no TORCHELASTIC_* yet)."""
    port = _free_port()
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    for key in TORCHRUN_ENV:
        monkeypatch.delenv(key, raising=False)
    return port


def _launch_one(raw_key: str) -> tuple[int, int]:
    return launch(_claim_and_read_raw_key, ["cpu"], raw_key, timeout_s=30, cpu_threads=torch.get_num_threads())


def test_rank_zero_hosts_the_store_when_no_agent_does(torchrun_env: int) -> None:
    """RANK etc. set by hand or by SLURM: rank 0 serves MASTER_PORT; keys go under the default run prefix."""
    assert _launch_one("rsnet/none/0/claims") == (3, 3)
    assert not dist.is_initialized()


def test_workers_join_the_agent_store_under_run_id_and_restart(torchrun_env: int,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    agent = dist.TCPStore("127.0.0.1", torchrun_env, 2, True, timeout=datetime.timedelta(seconds=30),
                          wait_for_workers=False)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "aid-run")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    agent.set("rsnet/aid-run/2/claims", "10")  # what an earlier claim of this attempt left
    agent.set("rsnet/aid-run/1/claims", "1000")  # the failed attempt's counter: not this one's
    assert _launch_one("rsnet/aid-run/2/claims") == (13, 13)
    assert not dist.is_initialized()


def test_missing_master_endpoint_is_named(torchrun_env: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(ValueError, match="no MASTER_PORT in the environment"):
        _launch_one("claims")
    monkeypatch.setenv("MASTER_PORT", "http")
    with pytest.raises(ValueError, match="MASTER_PORT='http'"):
        _launch_one("claims")


def test_workers_agree_on_one_backend_through_the_store() -> None:
    """Each node knows its own devices only: a node of GPUs beside a node with a CPU worker must not pick NCCL while
    the other picks gloo. Every worker publishes its device in the store and reads everyone's."""
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)

    def worker(case: str, devices: list[str], rank: int) -> str:
        client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=30))
        return agree_backend(dist.PrefixStore(case, client), rank, len(devices), devices[rank])

    for case, devices, expected in (("mixed", ["cuda:0", "cpu", "cuda:1"], "gloo"),
                                    ("gpus", ["cuda:0", "cuda:0"], "nccl"), ("cpus", ["cpu", "cpu"], "gloo")):
        with ThreadPoolExecutor(len(devices)) as pool:  # one thread (and store client) per worker
            chosen = list(pool.map(lambda rank: worker(case, devices, rank), range(len(devices))))
        assert chosen == [expected] * len(devices), case


# ------------------------------------------------------------------------------------ end to end


def _run(command: list[str], timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess | None:
    """Run ``command`` from the repository root in its own session; None (all of it killed) on timeout."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", *TORCHRUN_ENV)}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun's workers too, not only the agent
        process.communicate()
        return None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _skip_unless_torchrun_works() -> None:
    """Skip when even a do-nothing ``torchrun --standalone`` fails here (e.g. no usable loopback)."""
    probe = _run([*TORCHRUN, "--no-python", sys.executable, "-c", "pass"], timeout_s=120)
    if probe is None or probe.returncode != 0:
        reason = "timed out after 120 s" if probe is None else f"exit {probe.returncode}: {probe.stderr[-500:]}"
        pytest.skip(f"torchrun --standalone does not work in this environment ({reason})")


def _two_nodes(run_dir: Path, *overrides: str) -> list[subprocess.CompletedProcess]:
    """Two torchrun agents on this machine as two nodes of one CPU worker each (c10d rendezvous on 127.0.0.1);
    both must exit 0."""
    endpoint = f"127.0.0.1:{_free_port()}"
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id=rsnet-{run_dir.name}",
               str(REPO / "scripts" / "train.py"), *[o for o in TINY if not o.startswith("trainer.devices=")],
               "trainer.devices=[cpu]", f"hydra.run.dir={run_dir}", *overrides]
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: _run(command), range(2)))
    failed = [done for done in runs if done is None or done.returncode != 0]
    if failed:
        _skip_unless_torchrun_works()
        pytest.fail("two torchrun nodes failed:\n" + "\n".join("(timed out)" if done is None else
                                                                f"{done.stdout}\n{done.stderr}" for done in failed))
    return runs


@pytest.mark.slow
def test_two_torchrun_nodes_agree_on_a_backend_train_and_resume(tmp_path: Path) -> None:
    """``--nnodes=2``: the two nodes' workers form one run (rank 0 writes it), agree on the backend through the store,
    and a second launch with resume=true continues from the first one's checkpoint. (One proof of rsnet's torchrun
    path: ``--standalone --nproc-per-node=2`` starts the same workers through the same environment.)"""
    run_dir = tmp_path / "nodes"
    runs = _two_nodes(run_dir, "trainer.merge_rounds=1")
    output = "".join(done.stdout + done.stderr for done in runs)
    assert "ChildFailedError" not in output and "Traceback" not in output, output
    assert "backend gloo, agreed by the 2 workers through the store" in output, output
    assert output.count("run dir: ") == 1, output  # one primary over the two nodes prints the final figures
    # the run's outputs as rsnet's own launch writes them (test_train_e2e.py checks those in full); only rank 0
    # writes Hydra's files and the log
    assert (run_dir / "checkpoints" / "last.pt").is_file() and (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "train.log").read_text().count("[rsnet.data.datasets]") == 1  # rank 0's line only
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and len(metrics["scheduler"]["workers"]) == 2
    assert [row["epoch"] for row in metrics["history"]] == [1]
    assert sum(w["samples"] for w in metrics["scheduler"]["workers"]) == metrics["train_samples"]
    runs = _two_nodes(run_dir, "trainer.merge_rounds=1", "epochs=2", "resume=true")
    assert "resumed from" in "".join(done.stdout + done.stderr for done in runs)
    resumed = json.loads((run_dir / "metrics.json").read_text())
    assert resumed["epochs"] == 2 and [row["epoch"] for row in resumed["history"]] == [1, 2]


@pytest.mark.slow
def test_torchrun_restarts_the_workers_from_the_last_merge_after_a_loss(tmp_path: Path) -> None:
    """``--max-restarts=1``: worker 1 is lost (SIGKILL) in epoch 2; torchrun's agent starts both workers again
    (TORCHELASTIC_RESTART_COUNT=1), which go on from the run dir's commit.pt, not from its start: every epoch trains
    its samples once, and the run records the restart."""
    run_dir = tmp_path / "restarted"
    done = _run([*TORCHRUN, "--max-restarts=1", str(REPO / "scripts" / "train.py"), *TINY, "epochs=3",
                 "trainer.merge_rounds=1", "trainer.merge_rounds_max=null", "trainer.lose_worker=[1,2,3]",
                 f"hydra.run.dir={run_dir}"])
    if done is None or done.returncode != 0:
        _skip_unless_torchrun_works()
    assert done is not None and done.returncode == 0, (done.stdout + done.stderr)[-3000:] if done else "timed out"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["epochs"] == 3
    assert [row["train/samples"] for row in metrics["history"]] == [metrics["train_samples"]] * 3
    [change] = metrics["membership_changes"]
    assert change["torchrun_restart"] == 1 and change["workers"] == 2 and change["resumed_from"] == "commit.pt"


@pytest.mark.slow
def test_a_node_that_joins_mid_run_is_probed_and_given_work(tmp_path: Path) -> None:
    """``--nnodes=1:2``: the first node trains alone; a second node joins at torchrun's next rendezvous, which starts
    both workers again from the run's newest commit point; the newcomer is probed and trains its share, and every
    epoch still trains its samples once. The first node's worker is held (SIGSTOP) from its first checkpoint until
    its agent has seen the newcomer, so the join lands mid-run however fast the machine is. torch's late join needs
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (with the shared store the newcomer waits for the round's address)."""
    run_dir, logs = tmp_path / "joined", [tmp_path / "first.log", tmp_path / "second.log"]
    env = {key: value for key, value in os.environ.items()
           if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", *TORCHRUN_ENV)}
    env.update(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", LOGLEVEL="INFO")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}", "--rdzv-id=rsnet-joined",
               "--rdzv-conf=last_call_timeout=1", str(REPO / "scripts" / "train.py"),
               *[o for o in TINY if not o.startswith("trainer.devices=")], "trainer.devices=[cpu]", "epochs=3",
               f"hydra.run.dir={run_dir}"]
    nodes: list[subprocess.Popen] = []
    try:
        for log in logs:
            with log.open("w") as out:
                nodes.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True))
            if len(nodes) == 1:  # the first node alone, until its first checkpoint
                wait_for((run_dir / "checkpoints" / "last.pt").exists, "the first node's first epoch", alive=nodes[0])
                worker = int(wait_for(lambda: next(run_dir.glob(".rsnet.worker-*.lock"), None),
                                      "the first node's worker").stem.split("-")[-1])
                os.kill(worker, signal.SIGSTOP)
        wait_for(lambda: "new nodes" in logs[0].read_text(), "the first node's agent seeing the second",
                 alive=nodes[0])
        os.kill(worker, signal.SIGCONT)  # it takes the agent's SIGTERM, and both nodes start their workers again
        codes = [node.wait(timeout=RUN_TIMEOUT_S) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    output = "".join(log.read_text() for log in logs)
    if codes != [0, 0]:
        _skip_unless_torchrun_works()
    assert codes == [0, 0], output[-4000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["epochs"] == 3 and len(metrics["scheduler"]["workers"]) == 2
    assert [row["train/samples"] for row in metrics["history"]] == [metrics["train_samples"]] * 3
    [change] = metrics["membership_changes"]
    assert change["workers"] == 2 and change["resumed_from"] in ("last.pt", "commit.pt")
    assert "speed probes (samples/s): w0 " in output and ", w1 " in output  # the newcomer is measured
    assert output.count("run dir: ") == 1
