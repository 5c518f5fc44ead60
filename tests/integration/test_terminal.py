"""``bigtrain train --nproc 2`` as a person meets it in a terminal: quiet output, Ctrl-C, SIGTERM, a launcher killed
outright and a worker killed outright. Each ends with one line, the right exit code, and (where a step can end) a
checkpoint the next start resumes from.

Ctrl-C is sent as a terminal sends it: by tmux's send-keys to a real pane where tmux is installed, else as SIGINT to
the launcher's whole process group (what the terminal driver does on Ctrl-C).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, read_metrics, recipe_dict, save_rows, write_recipe

pytestmark = pytest.mark.full


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    return save_rows(tmp_path_factory.mktemp("terminal") / "rows.npy", num_rows=64, seq_len=17, learnable=True)


def recipe(rows: Path, folder: Path, steps: int = 100_000, every: int = 0, backend: str = "fsdp2", **train) -> Path:
    return write_recipe(
        folder / "recipe.yaml",
        recipe_dict(
            folder / "out",
            rows,
            train={"steps": steps, "global_batch_size": 4, "warmup_steps": 1, **train},
            parallel={"backend": backend, "micro_batch_size": 2},
            checkpoint={"every": every},
        ),
    )


def command(path: Path, *sets: str) -> list[str]:
    extra = [a for s in sets for a in ("--set", s)]
    return [sys.executable, "-m", "bigtrain", "train", str(path), "--nproc", "2", *extra]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}


def wait_for_steps(out: Path, steps: int, job: subprocess.Popen | None = None, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ((out / "metrics.jsonl").is_file() and len(read_metrics(out)) >= steps):
        if time.monotonic() > deadline or (job is not None and job.poll() is not None):
            raise AssertionError("training did not start")
        time.sleep(0.2)


def processes_running(text: str) -> list[int]:
    mine = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != mine:
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def workers_of(out: Path) -> list[int]:
    return sorted(pid for pid in processes_running(f"output_dir={out}") if b"--quiet-failures" in _cmdline(pid))


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def lines_of(text: str) -> list[str]:
    """What a person reads: progress bar redraws dropped, blank lines dropped."""
    return [line for line in re.split(r"[\r\n]", text) if line.strip() and not line.startswith("train:")]


def start(path: Path, out: Path, log, *sets: str) -> subprocess.Popen:
    return subprocess.Popen(
        command(path, f"output_dir={out}", *sets),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env=clean_env(),
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )


def signal_a_worker(path: Path, out: Path, log_path: Path, sig: signal.Signals, timeout: float) -> tuple:
    """Start the job, send ``sig`` to its last worker after 4 steps, and wait for the launcher: (its exit code, seconds
    from the signal to its exit, the worker's pid, what the terminal showed). Nothing of the job is left running."""
    with open(log_path, "w") as log:
        job = start(path, out, log)
        try:
            wait_for_steps(out, 4, job)
            victim = workers_of(out)[-1]
            os.kill(victim, sig)
            started = time.monotonic()
            code = job.wait(timeout=timeout)
            took = time.monotonic() - started
        finally:
            job.kill()
            for pid in workers_of(out):
                os.kill(pid, signal.SIGKILL)
    return code, took, victim, log_path.read_text()


def test_a_deepspeed_run_prints_its_plan_progress_and_summary_only(rows, tmp_path):
    """84,164 lines of deprecation warnings for a DeepSpeed ZeRO-3 run before: now ≤ 40 lines for 20 steps."""
    path = recipe(rows, tmp_path, steps=20, every=10, backend="deepspeed")
    proc = subprocess.run(command(path), capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = lines_of(proc.stdout + proc.stderr)
    assert len(shown) <= 40, "\n".join(shown)
    assert not [line for line in shown if not line.startswith("bigtrain: ")], "\n".join(shown)
    assert any(line.startswith("bigtrain: plan deepspeed zero3 dp=2") for line in shown)


def test_ctrl_c_checkpoints_at_the_step_says_one_line_exits_130_and_the_next_start_resumes(rows, tmp_path):
    # a constant schedule: the resumed start asks for fewer steps, which would change a cosine schedule's values
    path, out = recipe(rows, tmp_path, lr_schedule="constant"), tmp_path / "out"
    log = tmp_path / "terminal.log"
    if shutil.which("tmux"):
        session = f"bigtrain-test-{os.getpid()}"
        shell = " ".join(command(path, f"output_dir={out}")) + f" > {log} 2>&1; echo EXIT=$? >> {log}"
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", shell], check=True)
        try:
            wait_for_steps(out, 3)
            subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
            deadline = time.monotonic() + 120
            while "EXIT=" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        text = log.read_text()
        code = int(re.search(r"EXIT=(\d+)", text).group(1))
    else:
        with open(log, "w") as handle:
            job = start(path, out, handle)
            wait_for_steps(out, 3, job)
            os.killpg(job.pid, signal.SIGINT)
            code = job.wait(timeout=120)
        text = log.read_text()
    stopped_at = read_metrics(out)[-1]["step"]
    assert code == 130, text[-3000:]
    assert "Traceback" not in text and "[rank" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    said = [line for line in lines_of(text) if "Ctrl-C" in line]
    checkpoint = out / "checkpoints" / f"step_{stopped_at}"
    assert said == [
        f"bigtrain: Ctrl-C: stopped after step {stopped_at} of 100000 with a checkpoint ({checkpoint}); start again "
        "to resume"
    ]
    assert (checkpoint / "bigtrain.json").is_file()
    resumed = subprocess.run(
        command(path, f"output_dir={out}", f"train.steps={stopped_at + 2}"),
        capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {checkpoint}" in resumed.stderr
    assert [r["step"] for r in read_metrics(out)] == list(range(1, stopped_at + 3))
    # and exactly: the same losses as a run never interrupted
    straight = tmp_path / "straight"
    proc = subprocess.run(
        command(path, f"output_dir={straight}", f"train.steps={stopped_at + 2}"),
        capture_output=True, text=True, cwd=REPO, env=clean_env(), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    interrupted, uninterrupted = [r["loss"] for r in read_metrics(out)], [r["loss"] for r in read_metrics(straight)]
    assert interrupted == pytest.approx(uninterrupted, rel=1e-6, abs=0)


def test_sigterm_to_the_launcher_checkpoints_and_exits_0(rows, tmp_path):
    path, out = recipe(rows, tmp_path), tmp_path / "out"
    with open(tmp_path / "log", "w") as log:
        job = start(path, out, log)
        wait_for_steps(out, 2, job)
        job.send_signal(signal.SIGTERM)
        code = job.wait(timeout=120)
    text = (tmp_path / "log").read_text()
    assert code == 0, text[-3000:]
    assert "Traceback" not in text and "SignalException" not in text, text[-3000:]
    stopped_at = read_metrics(out)[-1]["step"]
    assert f"bigtrain: SIGTERM: stopped after step {stopped_at} of 100000 with a checkpoint" in text
    assert (out / "checkpoints" / f"step_{stopped_at}" / "bigtrain.json").is_file()


@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_sigterm_to_torchrun_or_accelerate_launch_checkpoints_at_the_step(rows, tmp_path, launcher):
    """Their launchers pass SIGTERM on to the workers, which stop after the step with a checkpoint as under --nproc;
    the launchers themselves then exit 1 with their own traceback (torch elastic's SignalException: not bigtrain's
    to change, docs/checkpoints.md says so)."""
    from helpers import torchrun_command

    path, out = recipe(rows, tmp_path), tmp_path / "out"
    if launcher == "torchrun":
        argv = torchrun_command(["train", str(path)])
    else:
        argv = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--multi_gpu"]
        argv += ["-m", "bigtrain", "train", str(path)]
    with open(tmp_path / "log", "w") as log:
        job = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=clean_env())
        try:
            wait_for_steps(out, 2, job)
            job.send_signal(signal.SIGTERM)
            job.wait(timeout=120)
        finally:
            job.kill()
    text = (tmp_path / "log").read_text()
    stopped_at = read_metrics(out)[-1]["step"]
    checkpoint = out / "checkpoints" / f"step_{stopped_at}"
    said = f"bigtrain: SIGTERM: stopped after step {stopped_at} of 100000 with a checkpoint ({checkpoint})"
    assert said in text and (checkpoint / "bigtrain.json").is_file(), text[-3000:]
    assert "bigtrain: done:" in text  # the workers ended cleanly after their save


def test_workers_do_not_outlive_a_launcher_killed_outright(rows, tmp_path):
    path, out = recipe(rows, tmp_path), tmp_path / "out"
    with open(tmp_path / "log", "w") as log:
        job = start(path, out, log)
        try:
            wait_for_steps(out, 2, job)
            assert len(workers_of(out)) == 2
            job.kill()  # kill -9 of the launcher
            job.wait(timeout=10)
            deadline = time.monotonic() + 10
            while workers_of(out) and time.monotonic() < deadline:
                time.sleep(0.2)
            alive = workers_of(out)
        finally:
            for pid in workers_of(out):
                os.kill(pid, signal.SIGKILL)
    assert alive == [], "workers still running 10 s after their launcher was killed"
    stopped_at = read_metrics(out)[-1]["step"]  # they stopped as under SIGTERM: at a step, with a checkpoint
    assert (out / "checkpoints" / f"step_{stopped_at}" / "bigtrain.json").is_file()


def test_a_worker_killed_outright_is_named_with_the_last_good_checkpoint(rows, tmp_path):
    path, out = recipe(rows, tmp_path, every=2), tmp_path / "out"
    code, took, victim, text = signal_a_worker(path, out, tmp_path / "log", signal.SIGKILL, timeout=60)
    assert code != 0 and took < 60
    assert "Traceback" not in text and "terminate called" not in text, text[-3000:]
    said = [line for line in lines_of(text) if line.startswith("bigtrain: error")]
    assert len(said) == 1, text[-3000:]
    assert re.fullmatch(
        rf"bigtrain: error: rank [01] \(pid {victim} on .+\) was killed by SIGKILL; the other ranks were stopped; "
        rf"the last good checkpoint is {re.escape(str(out / 'checkpoints'))}/step_\d+; start again to resume",
        said[0],
    ), said[0]


def test_a_rank_that_stops_answering_ends_the_job_within_the_timeout_and_is_named(rows, tmp_path):
    """SIGSTOP of one worker (a hang as the others see it): the other rank gives up after train.collective_timeout_s,
    the launcher kills the silent one (its SIGTERM waits while it is stopped: torch's agent escalates after 30 s) and
    names it, exit 7. Before: 78 lines of rank 0's gloo traceback, then 'rank 1 was killed by SIGKILL'."""
    timeout_s = 8
    path, out = recipe(rows, tmp_path, every=2, collective_timeout_s=timeout_s), tmp_path / "out"
    code, took, victim, text = signal_a_worker(path, out, tmp_path / "log", signal.SIGSTOP, timeout=timeout_s + 60)
    assert code == 7 and took < timeout_s + 45, (code, took, text[-3000:])
    assert "Traceback" not in text and "[rank" not in text, text[-3000:]
    said = [line for line in lines_of(text) if line.startswith("bigtrain: error")]
    assert len(said) == 1, text[-3000:]
    assert re.fullmatch(
        rf"bigtrain: error: rank 1 \(pid {victim} on .+\) stopped answering: rank 0 waited "
        r"train.collective_timeout_s for it in a collective, and it was then killed \(hung or stopped\); the last good "
        rf"checkpoint is {re.escape(str(out / 'checkpoints'))}/step_\d+; start again to resume",
        said[0],
    ), said[0]


def test_an_error_on_every_rank_is_said_once(rows, tmp_path):
    path = recipe(rows, tmp_path, steps=2)
    proc = subprocess.run(
        command(path, "data.path=/nonexistent/rows.npy"), capture_output=True, text=True, cwd=REPO, env=clean_env(),
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 2
    shown = lines_of(proc.stdout + proc.stderr)
    assert len(shown) == 1 and shown[0].startswith("bigtrain: error (rank "), shown
    assert "data.path='/nonexistent/rows.npy' does not exist" in shown[0]
