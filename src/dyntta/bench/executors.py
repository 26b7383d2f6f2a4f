"""Where the cells of a grid run: here, in local worker processes, or as Slurm jobs (submitit).

An executor takes a job (a picklable ``cell -> record`` callable) and the unfinished cells and
yields ``(cell, record)`` or ``(cell, Failure)`` as cells end, in any order. It never writes the
results file: the driver (:func:`dyntta.bench.runner.run_grid`) appends what it yields, so
resuming and skipping finished cells work the same everywhere.

Slurm jobs read the caches the driver built (data sets, checkpoints) and write their logs and
results under the run folder, so both must be on a filesystem the compute nodes share with the
driver; every job first checks that it sees a marker the driver wrote into the cache folder.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import multiprocessing
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import torch
from tqdm import tqdm

from dyntta.atomic import write_atomic
from dyntta.bench.config import Cell, ExecutorSpec

Job = Callable[[Cell], dict]
Outcome = tuple[Cell, "dict | Failure"]


@dataclasses.dataclass(frozen=True)
class Failure:
    """A cell that ended without a record: its key, what happened and where its log is."""

    key: str
    message: str
    log: str | None = None

    def __str__(self) -> str:
        return f"cell {self.key}: {self.message}" + (f" (log: {self.log})" if self.log else "")


class CellsFailed(RuntimeError):
    """Some cells failed (the others finished and were recorded); one line per failure."""

    def __init__(self, failures: list[Failure]):
        self.failures = failures
        super().__init__(f"{len(failures)} cell(s) failed:\n" + "\n".join(map(str, failures)))


class Executor(Protocol):
    threads: int | None  # torch threads per cell; None: cells run in this process as it is

    def map(self, job: Job, cells: list[Cell]) -> Iterator[Outcome]: ...


class SerialExecutor:
    """Run the cells one after another in this process (errors propagate as they are)."""

    threads = None

    def map(self, job: Job, cells: list[Cell]) -> Iterator[Outcome]:
        for cell in cells:
            yield cell, job(cell)


@dataclasses.dataclass
class ProcessExecutor:
    """Run the cells in ``workers`` spawned local processes."""

    workers: int

    @property
    def threads(self) -> int:
        return max(1, torch.get_num_threads() // self.workers)

    def map(self, job: Job, cells: list[Cell]) -> Iterator[Outcome]:
        context = multiprocessing.get_context("spawn")
        # Ctrl-C stops the driver, which stops the workers: processes spawned here (the pool's
        # helper and workers, spawned by submit) inherit an ignored SIGINT from birth
        with _handling(signal.SIGINT, signal.SIG_IGN):
            pool = concurrent.futures.ProcessPoolExecutor(self.workers, mp_context=context,
                                                          initializer=_worker_start)
            futures = {pool.submit(job, cell): cell for cell in cells}
        with pool:
            try:
                for future in concurrent.futures.as_completed(futures):
                    cell = futures[future]
                    try:
                        yield cell, future.result()
                    except Exception as exc:  # reported with its cell; the other cells go on
                        yield cell, Failure(cell.key, f"{type(exc).__name__}: {exc}")
            except BaseException:  # Ctrl-C, or the driver stops early: nothing more is recorded
                _terminate(pool)
                raise


def _worker_start() -> None:
    """Workers show no progress bars: give tqdm a thread lock instead of the semaphore it would
    make, which a worker stopped mid-cell could not release (Python warns of a leak at exit).
    A warning is one line, as the command shows its own."""
    tqdm.set_lock(threading.RLock())
    warnings.showwarning = warning_printer("dyntta worker")


def warning_printer(who: str) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints ``{who}: warning: {message}``, one line on stderr
    (not the file and line that warned)."""
    def show(message, *_args, **_kwargs) -> None:
        print(f"{who}: warning: {message}", file=sys.stderr)
    return show


def _terminate(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Drop the queued cells and stop the running ones now (their records would be dropped
    anyway): ``ProcessPoolExecutor.terminate_workers`` of Python 3.14, for older versions."""
    for process in list((pool._processes or {}).values()):
        process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)  # the pool sees its workers gone and cleans up


@dataclasses.dataclass(frozen=True)
class SharedCheck:
    """Wraps a job: fail clearly when the driver's ``marker`` file is not visible here."""

    job: Job
    marker: Path

    def __call__(self, cell: Cell) -> dict:
        if not self.marker.is_file():
            raise FileNotFoundError(
                f"the cache folder {self.marker.parent} is not visible on {socket.gethostname()}: "
                "put --cache-dir (and the run folder) on a filesystem the compute nodes share")
        return self.job(cell)


@dataclasses.dataclass
class SlurmExecutor:
    """One Slurm job per cell, submitted as one job array through submitit.

    Args:
        spec: partition, time limit (minutes), GPUs and CPUs per cell, array parallelism.
        folder: submitit's folder (pickles, logs, results); on a shared filesystem.
        cache: the cache folder the jobs read; checked for visibility by every job.
        cluster: submitit's cluster: ``"slurm"``, or ``"local"`` (local processes, for tests).
        poll_s: seconds between checks of the jobs' states.
        recheck_s: seconds between asking squeue about jobs that sacct does not know (a queued
            array task cancelled before it ran, or any job on a cluster without accounting): a
            job squeue reports ended, or has forgotten, twice in a row without a result failed.
        log: where the submission line goes (None: nowhere).
    """

    spec: ExecutorSpec
    folder: Path
    cache: Path
    cluster: str = "slurm"
    poll_s: float = 1.0
    recheck_s: float = 15.0
    log: Any = sys.stderr

    @property
    def threads(self) -> int:
        return self.spec.cpus_per_cell

    def map(self, job: Job, cells: list[Cell]) -> Iterator[Outcome]:
        try:
            import submitit
        except ImportError as exc:
            raise ValueError("the slurm executor needs submitit: pip install 'dyntta[slurm]'") from exc
        if not cells:
            return
        marker = self.cache / ".dyntta-jobs" / uuid.uuid4().hex
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        executor = submitit.AutoExecutor(folder=self.folder / "%j", cluster=self.cluster)
        s = self.spec
        executor.update_parameters(
            name="dyntta", timeout_min=s.slurm_time, gpus_per_node=s.gpus_per_cell,
            cpus_per_task=s.cpus_per_cell, slurm_array_parallelism=s.array_parallelism,
            # submitit's time-limit warning, 90 s before the end by default: with a 1- or 2-minute
            # limit that would come before the job has loaded its cell (and kill it unnamed)
            slurm_signal_delay_s=min(90, 30 * s.slurm_time),
            **({"slurm_partition": s.slurm_partition} if s.slurm_partition else {}),
        )
        arrays = self.folder / "arrays"  # the array this driver has out, until it ends
        if self.cluster == "slurm":
            self._cancel_leftovers(arrays)
        jobs = {}
        try:
            with _handling(signal.SIGTERM, _interrupt):  # SIGTERM cancels the jobs too
                jobs = dict(zip(executor.map_array(SharedCheck(job, marker), cells), cells))
                array = next(iter(jobs)).job_id.split("_")[0]
                if self.cluster == "slurm":
                    write_atomic(arrays, array + "\n")
                if self.log is not None:
                    print(f"submitted {len(jobs)} cells as Slurm job array {array} "
                          f"(logs in {self.folder})", file=self.log)
                suspects, checked = {}, time.monotonic()
                while jobs:
                    for j in [j for j in jobs if j.done()]:
                        cell = jobs.pop(j)
                        yield cell, _outcome(j, cell, s.slurm_time)
                    if self.cluster == "slurm" and time.monotonic() - checked > self.recheck_s:
                        gone = _ended_unrecorded([j for j in jobs if j.state == "UNKNOWN"])
                        for j in set(gone) & set(suspects):
                            if not j.done():
                                cell = jobs.pop(j)
                                yield cell, Failure(cell.key, f"job {j.job_id}: ended without a "
                                                    f"result ({gone[j]})", _log(j))
                        suspects, checked = gone, time.monotonic()
                    if jobs:
                        time.sleep(self.poll_s)
        finally:
            for j in jobs:  # the driver stops early: cancel what it would not record
                j.cancel(check=False)
            marker.unlink(missing_ok=True)
            arrays.unlink(missing_ok=True)

    def _cancel_leftovers(self, arrays: Path) -> None:
        """Cancel the array of a driver that was killed before it could (SIGKILL, a lost node):
        its jobs would run on with nobody to record them. The run folder's lock guarantees
        that driver is gone."""
        if not arrays.is_file():
            return
        ids = arrays.read_text().split()
        subprocess.run(["scancel", *ids], capture_output=True, timeout=60, check=False)
        arrays.unlink()
        if self.log is not None:
            print(f"cancelled Slurm job array {', '.join(ids)}, left by a driver that was "
                  "killed", file=self.log)


def _outcome(job: Any, cell: Cell, minutes: int) -> dict | Failure:
    """The record of a finished submitit job, or its failure with the cause and the log.

    A job that reaches its time limit (``minutes``) gets submitit's signal (SIGUSR2) shortly
    before it and ends with submitit's "timed-out and not checkpointable"; if the signal came
    before submitit could handle it (the job was still loading its cell), srun's log names the
    signal; if it could not act on it, Slurm ends it with state TIMEOUT. Each is named as a time
    limit."""
    from submitit.core.utils import FailedJobError

    try:
        return job.result()
    except FailedJobError as exc:  # the cell raised: name the exception (the trace's last line)
        parts = str(exc).split("-" * 22)
        lines = [line.strip() for line in parts[min(1, len(parts) - 1)].splitlines()]
        reason = next((line for line in reversed(lines) if line), type(exc).__name__)
        timed_out = "timed-out and not checkpointable" in reason
    except Exception:  # UncompletedJobError: time limit, node loss, cancelled
        state = job.state
        reason = f"ended without a result (Slurm state {state})"
        timed_out = state.startswith("TIMEOUT") or _killed_by_the_warning(job)
    if timed_out:
        reason = f"reached its time limit of {minutes} min (give more with --slurm-time)"
    return Failure(cell.key, f"job {job.job_id}: {reason}", _log(job))


def _killed_by_the_warning(job: Any) -> bool:
    """Whether srun's log says the time-limit warning (SIGUSR2) killed the job, which had not
    yet installed submitit's handler (it was still loading its cell)."""
    log = _log(job)
    return log is not None and "User defined signal 2" in Path(log).read_text(errors="replace")


def _log(job: Any) -> str | None:
    """The job's error log, if it wrote one (a job that never started did not)."""
    return str(job.paths.stderr) if job.paths.stderr.exists() else None


ACTIVE = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "REQUEUED",
          "RESIZING", "STAGE_OUT", "SIGNALING"}


def _ended_unrecorded(jobs: list[Any]) -> dict[Any, str]:
    """Of ``jobs`` (that sacct does not know), those squeue says ended or no longer knows."""
    if not jobs:
        return {}
    ids = ",".join(sorted({j.job_id.split("_")[0] for j in jobs}))
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-j", ids, "-o", "%i %T"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}  # Slurm does not answer now: ask again later
    states = dict(line.split(maxsplit=1) for line in out.splitlines() if " " in line)
    ended = {j: states.get(j.job_id, "no longer known to Slurm") for j in jobs}
    return {j: f"Slurm state {state}" if j.job_id in states else state
            for j, state in ended.items() if state not in ACTIVE}


@contextlib.contextmanager
def _handling(signum: int, handler: Any) -> Iterator[None]:
    """Set ``handler`` for ``signum`` in the block (main thread only; elsewhere left alone)."""
    try:
        previous = signal.signal(signum, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signum, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def make_executor(spec: ExecutorSpec, workers: int, folder: Path, cache: Path) -> Executor:
    """The executor a grid asks for: ``spec.kind`` ``slurm``, else serial or ``workers``
    processes."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if spec.kind == "slurm":
        check_slurm()
        return SlurmExecutor(spec, folder, cache)
    return SerialExecutor() if workers == 1 else ProcessExecutor(workers)


def check_slurm() -> None:
    """Raise ``ValueError`` unless submitit is installed and Slurm's ``sbatch`` is on the PATH."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("submitit") is None:
        raise ValueError("the slurm executor needs submitit: pip install 'dyntta[slurm]'")
    if shutil.which("sbatch") is None:
        raise ValueError("the slurm executor needs Slurm, but sbatch is not on the PATH here: run "
                         "on the cluster's login node, or use --executor process")
