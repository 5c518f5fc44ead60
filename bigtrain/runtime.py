"""The process's place in the job: launcher variables (read here and nowhere else), device and process group.

torchrun and ``accelerate launch`` both export RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Without
them we are a single process, and still build a one-rank gloo/nccl group so that the trainer has a single code path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a device or group is made: bigtrain plan reads LaunchEnv without it
    import torch


@dataclass(frozen=True)
class LaunchEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int  # ranks on this node
    launched: bool  # True under torchrun / accelerate launch / bigtrain --nproc


def read_launch_env() -> LaunchEnv:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return LaunchEnv(
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"])),
            launched=True,
        )
    return LaunchEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, launched=False)


def warn_if_accelerate_started_one_process(env: LaunchEnv) -> None:
    # accelerate's single-process launcher exports its own variables but no WORLD_SIZE: on a host with fewer than
    # 2 GPUs, `accelerate launch --num_processes N` starts one process unless its config selects MULTI_GPU.
    if "ACCELERATE_MIXED_PRECISION" in os.environ and not env.launched:
        logging.getLogger("bigtrain").warning(
            "accelerate launch started a single process; to run several on CPU add --multi_gpu "
            "or set distributed_type: MULTI_GPU in the accelerate config"
        )


@contextlib.contextmanager
def as_launched(env: LaunchEnv) -> Iterator[None]:
    """For a process started without a launcher, the LOCAL_RANK torchrun would have given its one worker, for the
    job's life (DeepSpeed reads it from the environment whenever it builds or steps, and asserts it is set); taken
    away after, so that nothing else in the process (an HF Trainer started later, say) mistakes it for a
    launcher's. Under a launcher nothing changes."""
    if env.launched or "LOCAL_RANK" in os.environ:
        yield
        return
    os.environ["LOCAL_RANK"] = str(env.local_rank)
    try:
        yield
    finally:
        os.environ.pop("LOCAL_RANK", None)


def pick_device(env: LaunchEnv) -> torch.device:
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(env: LaunchEnv, device: torch.device, timeout_s: int) -> None:
    """nccl on CUDA, gloo on CPU; a timeout so that a dead peer fails the job instead of hanging it."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"backend": backend, "timeout": timedelta(seconds=timeout_s)}
    if device.type == "cuda":
        kwargs["device_id"] = device
    if env.launched:
        dist.init_process_group(**kwargs)
    else:
        dist.init_process_group(**kwargs, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)


def local_free_memory(env: LaunchEnv, device: torch.device) -> int:
    """Free memory of this rank's device (host memory per local rank on CPU)."""
    if device.type == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available // env.local_world_size)


def smallest_free_memory(env: LaunchEnv, device: torch.device) -> int:
    """Free device memory of the most constrained rank (host memory per local rank on CPU); needs the group."""
    import torch
    import torch.distributed as dist

    free = local_free_memory(env, device)
    value = torch.tensor([free], dtype=torch.int64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


def die_with_parent() -> None:
    """Ask Linux to send this worker SIGTERM when its launcher dies (``prctl(PR_SET_PDEATHSIG)``): a launcher killed
    outright (kill -9) cannot stop its workers, and they would train on as orphans. SIGTERM makes them stop after
    the current step with a checkpoint (``train/preemption.py``). Elsewhere nothing changes. (Linux sends it when
    the thread that started the worker ends: torch's elastic agent, under torchrun, ``accelerate launch`` and
    ``--nproc``, starts its workers from its main thread.)"""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the launcher died before the request was made: this worker was handed to init
        os.kill(os.getpid(), signal.SIGTERM)


# Long enough for a worker thread that waits for the GIL to be scheduled on a loaded machine; paid once per run.
WORKER_SETTLE_S = 0.2


def finish_collectives() -> None:
    """Return once every rank's collectives are done and this process's gloo workers have let go of them.

    A gloo worker frees a finished collective's tensors after the caller has been told it finished, and freeing a
    tensor Python has seen takes the GIL. The group's destructor joins those workers while holding the GIL, so a group
    freed in that gap deadlocks (seen: a rank hung in ~ProcessGroupGloo under DDP's reducer after its last step), and
    one left to interpreter shutdown aborts the process (pytorch/pytorch#190489). The barrier orders every earlier
    collective before it; the pause, which releases the GIL, lets a worker still freeing one finish.
    """
    import torch.distributed as dist

    dist.barrier()
    time.sleep(WORKER_SETTLE_S)
