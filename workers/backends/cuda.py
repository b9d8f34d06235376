"""The GPU backends: ``cuda-mps`` and ``cuda-timeslice`` (docs/DESIGN.md §2).

Both run the same trainer processes as the ``cpu`` backend (``python -m workers.training.trainer``, one
per assignment, started together at the READY/GO barrier, never forked), on one NVIDIA GPU
named by UUID in ``CUDA_VISIBLE_DEVICES``, with ``MTFL_TRAINER_DEVICE=cuda`` so the trainer
computes there. They differ in how a round's partitioning is realised:

================  ==========================================  ==================================
backend           ``timeslice`` (strategy ``temporal``)        ``mps`` (``isolation``,
                                                               ``sharing``, ``vres_*``)
================  ==========================================  ==================================
``cuda-mps``      plain CUDA contexts: each trainer's MPS      each trainer an MPS client of the
                  pipe directory is an empty folder, so it     agent's own daemon with its own
                  never reaches a daemon; the driver           ``CUDA_MPS_ACTIVE_THREAD_
                  time-slices the contexts                     PERCENTAGE`` (and
                                                               ``CUDA_MPS_PINNED_DEVICE_MEM_
                                                               LIMIT`` when the plan sets one)
``cuda-timeslice`` plain CUDA contexts, as above; no MPS        refused: without MPS a share
                  daemon at all                                cannot be granted
================  ==========================================  ==================================

``cuda-mps`` starts its private MPS control daemon (:class:`workers.backends.gpu_mps.MpsDaemon`) when
the agent starts (:meth:`CudaMpsBackend.start`) and quits it on exit and on SIGTERM
(:meth:`CudaMpsBackend.stop`, called by the agent's shutdown path). After a dispatch that
failed (a CUDA error, out of memory, a killed trainer: under MPS one client's fatal fault
reaches every client) it restarts the daemon before the next dispatch. Trainers killed during
an MPS dispatch are first ended with the daemon's ``terminate_client``.

Whether shares take effect is checked from inside the clients, by the SM count their CUDA
context reports (MPS lowers ``multi_processor_count`` to the client's share): when the backend
starts (and before the first MPS dispatch if it was not started) one probe client at
:data:`~workers.backends.gpu_mps.PROBE_SHARE` % must see fewer SMs than the GPU has, or every
``mps`` round is refused, saying why (:meth:`CudaMpsBackend.probe_mps`); after each MPS round
each trainer's ``visible_sm_count`` is checked against its share
(:func:`~workers.backends.gpu_mps.verify_client_sms`: ``mps_verified``,
``mps_active_thread_percentage``, ``mps_detail`` on the assignment's result).

Rounds are refused before launch when they co-locate more trainers than MPS serves
(:data:`~workers.backends.gpu_mps.MPS_MAX_CLIENTS`) or need more memory than the GPU has. During a round
a thread of the agent samples whole-GPU utilisation and memory through NVML every second
(``telemetry`` on the device's result). The agent process never initialises CUDA: inventory and
telemetry use NVML only (:mod:`workers.backends.gpu`). Importing this module imports neither torch nor
pynvml.

Configuration (environment, read when the backend is created): ``MTFL_AGENT_GPU`` (an NVML
index or a UUID; default 0), ``MTFL_MPS_CONTROL`` (the control binary; default
``nvidia-cuda-mps-control`` on ``PATH``), ``MTFL_MPS_TIMEOUT_S`` (seconds any call to the MPS
daemon may take; default 10).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

from workers.backends import gpu
from workers.backends.base import (
    AgentContext,
    BackendUnavailableError,
    TrainerProcessBackend,
    TrainerResources,
    round_request_problem,
)
from workers.backends.gpu_mps import (
    CONTROL_BINARY,
    MPS_MAX_CLIENTS,
    PROBE_SHARE,
    MpsDaemon,
    MpsError,
    client_server,
    control_binary,
    probe_verdict,
    read_server_log,
    timeout_from_env,
    verify_client_sms,
)
from workers.protocol.messages import (
    AssignmentResult,
    DeviceRoundResult,
    Partitioning,
    TrainRoundRequest,
)

logger = logging.getLogger(__name__)

ENV_TRAINER_DEVICE = "MTFL_TRAINER_DEVICE"
"""Set in a trainer's environment: ``cuda`` makes it train on the (one) visible GPU."""

TELEMETRY_INTERVAL_S = 1.0

# Variables a trainer must not inherit from the agent: they would pick another GPU, or make a
# time-sliced trainer an MPS client, or cap an MPS client's share, behind the plan's back.
_INHERITED_GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES",)
_MPS_PREFIX = "CUDA_MPS_"


class CudaBackend(TrainerProcessBackend):
    """What both GPU backends share: the GPU, trainer environments, limits, telemetry.

    Args:
        gpu_selector: the GPU (NVML index or UUID); default ``MTFL_AGENT_GPU`` or ``"0"``.

    Raises:
        ValueError: for a malformed selector, naming ``MTFL_AGENT_GPU``.
    """

    uses_mps: ClassVar[bool] = False
    # A profile job reused by a warm process reports its own peak (the allocator's peak
    # statistics are reset per job), and the CUDA context and cuDNN autotuning it keeps are
    # most of what a new profiler process costs on a GPU (15-27 s a configuration on the H200).
    profiles_warm = True

    def __init__(self, gpu_selector: str | None = None) -> None:
        self.gpu_selector = gpu.parse_gpu_selector(
            gpu_selector if gpu_selector is not None else os.environ.get(gpu.ENV_GPU)
        )
        self._info: gpu.GpuInfo | None = None
        self._last_telemetry_error = ""
        # Why `mps` dispatches are refused (cuda-mps: its start-up probe); never set without MPS.
        self._mps_refusal: str | None = None

    # ------------------------------------------------------------------ availability & facts

    def check_available(self) -> None:
        """Check the NVIDIA driver, the chosen GPU and torch (without importing torch or
        initialising CUDA): NVML must initialise and find the GPU.

        Raises:
            BackendUnavailableError: one line naming what is missing (the NVML bindings, the
                driver, a GPU, the chosen GPU, torch).
        """
        try:
            gpu.find_gpu(self.gpu_selector)
        except gpu.GpuUnavailableError as exc:
            raise BackendUnavailableError(f"{self.name}: {exc}") from None
        if importlib.util.find_spec("torch") is None:
            raise BackendUnavailableError(f"{self.name} needs torch built for CUDA: pip install torch")

    def gpu_info(self, *, probe: bool = False) -> gpu.GpuInfo:
        """The GPU's :class:`~workers.backends.gpu.GpuInfo`, read once through NVML; with ``probe``,
        also asks a torch subprocess for the SM count and compute capability NVML may lack
        when NVML has none (:func:`workers.backends.gpu.probe_cuda_device`).

        Raises:
            BackendUnavailableError: NVML cannot reach the GPU.
        """
        if self._info is None or (probe and self._info.sm_count is None):
            try:
                self._info = gpu.gpu_inventory(self.gpu_selector, probe=probe)
            except gpu.GpuUnavailableError as exc:
                raise BackendUnavailableError(f"{self.name}: {exc}") from None
        return self._info

    def describe(self) -> dict[str, object]:
        """The GPU for the device inventory: name, memory, SMs (the allocation units), UUID,
        index, driver and CUDA versions, compute capability and mode, and whether
        ``nvidia-cuda-mps-control`` is installed. When NVML has no SM count, the first call
        runs the SM probe subprocess (a few seconds); later calls reuse its answer.

        Raises:
            BackendUnavailableError: NVML cannot reach the GPU.
        """
        info = self.gpu_info(probe=True)
        return {
            "accelerator": info.name,
            "memory_bytes": info.memory_bytes,
            "allocation_units": info.sm_count,
            "gpu_uuid": info.uuid,
            "gpu_index": info.index,
            "driver_version": info.driver_version,
            "cuda_version": info.cuda_version,
            "sm_count": info.sm_count,
            "compute_capability": info.compute_capability,
            "compute_mode": info.compute_mode,
            "mps_available": control_binary() is not None,
        }

    # ------------------------------------------------------------------------- resources

    def request_problem(self, request: TrainRoundRequest, ctx: AgentContext) -> str | None:
        """:func:`~workers.backends.base.round_request_problem` with the GPU's memory and, under
        MPS, the MPS client limit; also refuses several time-sliced trainers on a GPU whose
        compute mode allows one context only."""
        if request.partitioning == "mps" and self._mps_refusal is not None:
            return f"mps rounds refused on this device: {self._mps_refusal}"
        try:
            info = self.gpu_info()
        except BackendUnavailableError as exc:
            return str(exc)
        problem = round_request_problem(
            request,
            ctx,
            max_processes=MPS_MAX_CLIENTS if request.partitioning == "mps" and self.uses_mps else None,
            memory_bytes=info.memory_bytes,
        )
        if problem:
            return problem
        if info.compute_mode == "Prohibited":
            return f"GPU {info.uuid} is in compute mode Prohibited: no process may use it"
        exclusive = info.compute_mode in ("Exclusive_Process", "Exclusive_Thread")
        if exclusive and request.partitioning == "timeslice" and len(request.assignments) > 1:
            return (
                f"round refused before launch: GPU {info.uuid} is in compute mode "
                f"{info.compute_mode}, which allows one CUDA context, but time slicing runs "
                f"{len(request.assignments)}; set it to Default (nvidia-smi -c DEFAULT)"
            )
        return None

    def _plain_env(self, ctx: AgentContext) -> dict[str, str]:
        """GPU variables of a trainer outside MPS: its GPU, and an empty MPS pipe directory so
        its CUDA driver finds no control daemon (not ours, not a system one in /tmp)."""
        empty = ctx.state_dir / "no-mps"
        empty.mkdir(parents=True, exist_ok=True)
        return {
            "CUDA_VISIBLE_DEVICES": self.gpu_info().uuid,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_MPS_PIPE_DIRECTORY": str(empty),
            ENV_TRAINER_DEVICE: "cuda",
        }

    @staticmethod
    def _threads(ctx: AgentContext, processes: int) -> int:
        # The GPU does the arithmetic; the CPU threads only feed it. Splitting the cores keeps
        # co-located trainers from oversubscribing them.
        return max(1, len(ctx.cores) // max(1, processes))

    def _timeslice_resources(self, count: int, ctx: AgentContext) -> list[TrainerResources]:
        env = self._plain_env(ctx)
        threads = self._threads(ctx, count)
        return [TrainerResources(threads=threads, cores=list(ctx.cores) or None, env=env) for _ in range(count)]

    def standalone_resources(self, ctx: AgentContext) -> TrainerResources:
        """The whole GPU, outside MPS, with all the device's cores."""
        return self._timeslice_resources(1, ctx)[0]

    def trainer_env(self, resources: TrainerResources) -> dict[str, str]:
        """The base environment less inherited GPU and MPS variables, then the trainer's own."""
        env = super().trainer_env(TrainerResources(threads=resources.threads, cores=resources.cores))
        for key in list(env):
            if key in _INHERITED_GPU_VARIABLES or key.startswith(_MPS_PREFIX):
                del env[key]
        env.update(resources.env)
        return env

    def gpu_telemetry(self, interval_s: float) -> gpu.GpuTelemetry | None:
        """Whole-GPU utilisation sampled through NVML every ``interval_s`` (not started);
        ``None`` when NVML cannot name the GPU (the configuration then has no busy fraction)."""
        try:
            uuid = self.gpu_info().uuid
        except BackendUnavailableError:
            return None
        return gpu.GpuTelemetry(uuid, interval_s)

    @staticmethod
    def _check_shares(shares: Sequence[int]) -> None:
        for k, share in enumerate(shares):
            if isinstance(share, bool) or not isinstance(share, int) or not 1 <= share <= 100:
                raise ValueError(f"shares[{k}] must be an integer in [1, 100] (percent), got {share!r}")

    # ----------------------------------------------------------------------------- rounds

    def run_round(self, request: TrainRoundRequest, ctx: AgentContext) -> DeviceRoundResult:
        """The base round (:meth:`TrainerProcessBackend.run_round`) with whole-GPU telemetry
        sampled every second while it runs (``telemetry`` on the result)."""
        try:
            uuid = self.gpu_info().uuid
        except BackendUnavailableError:
            uuid = None  # the round itself reports the unreachable GPU
        telemetry = gpu.GpuTelemetry(uuid, TELEMETRY_INTERVAL_S) if uuid and request.assignments else None
        if telemetry is not None:
            telemetry.start()
        try:
            result = super().run_round(request, ctx)
        finally:
            samples = telemetry.stop() if telemetry is not None else []
        return result.model_copy(update={"telemetry": samples})


class CudaTimesliceBackend(CudaBackend):
    """The ``temporal`` baseline on a GPU: co-located trainers as plain CUDA contexts, no MPS."""

    name = "cuda-timeslice"

    def resources_for_shares(
        self, shares: Sequence[int], partitioning: Partitioning, ctx: AgentContext
    ) -> list[TrainerResources]:
        """``timeslice``: every trainer gets the GPU outside MPS (shares are ignored).

        Raises:
            ValueError: for ``mps`` partitioning (this backend cannot grant a share; run the
                ``temporal`` strategy, or use a ``cuda-mps`` agent), an unknown partitioning,
                or a share outside ``[1, 100]``.
        """
        self._check_shares(shares)
        if partitioning == "timeslice":
            return self._timeslice_resources(len(shares), ctx)
        if partitioning == "mps":
            raise ValueError(
                "partitioning 'mps' needs MPS, which the cuda-timeslice backend never starts: "
                "plan this device with the 'temporal' strategy or run its agent with "
                "--backend cuda-mps"
            )
        raise ValueError(f"partitioning {partitioning!r} is unknown; allowed: 'timeslice', 'mps'")


class CudaMpsBackend(CudaBackend):
    """Co-located trainers as MPS clients of the agent's own daemon, each with its share."""

    name = "cuda-mps"
    uses_mps = True
    # An idle warm trainer is still an MPS client and holds one of the server's client slots.
    warm_process_limit = MPS_MAX_CLIENTS

    def __init__(self, gpu_selector: str | None = None) -> None:
        super().__init__(gpu_selector)
        self._timeout_s = timeout_from_env()
        self._daemon: MpsDaemon | None = None
        self._restart_pending = False
        self._restarted = False
        self._log_marks: dict[Path, int] = {}
        self._probed = False
        # MPS clients seen connecting in the server log, by pid, since the daemon last started:
        # a warm trainer connected in an earlier round than the one it trains now.
        self._clients: dict[int, int] = {}

    def check_available(self) -> None:
        """Also check for ``nvidia-cuda-mps-control`` (``MTFL_MPS_CONTROL`` or ``PATH``).

        Raises:
            BackendUnavailableError: naming what is missing.
        """
        super().check_available()
        if control_binary() is None:
            raise BackendUnavailableError(
                f"cuda-mps: {CONTROL_BINARY} not found (set MTFL_MPS_CONTROL or put the NVIDIA "
                "driver's utilities on PATH)"
            )

    def daemon(self, ctx: AgentContext) -> MpsDaemon:
        """This agent's :class:`~workers.backends.gpu_mps.MpsDaemon` (not started by this call).

        Its pipe and log directories are ``state_dir/mps/pipe`` and ``state_dir/mps/log``,
        unless the agent's environment names them (``CUDA_MPS_PIPE_DIRECTORY``,
        ``CUDA_MPS_LOG_DIRECTORY``: docker-compose.yml puts them on volumes).

        Raises:
            BackendUnavailableError: the control binary or the GPU cannot be found, or
                ``MTFL_MPS_TIMEOUT_S`` is invalid.
        """
        if self._daemon is None:
            binary = control_binary()
            if binary is None:
                raise BackendUnavailableError(f"cuda-mps: {CONTROL_BINARY} not found")
            pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "").strip()
            log = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "").strip()
            self._daemon = MpsDaemon(
                binary=binary,
                pipe_dir=Path(pipe) if pipe else ctx.state_dir / "mps" / "pipe",
                log_dir=Path(log) if log else ctx.state_dir / "mps" / "log",
                gpu_uuid=self.gpu_info().uuid,
                timeout_s=self._timeout_s,
            )
        return self._daemon

    def start(self, ctx: AgentContext) -> None:
        """Start the MPS control daemon and check it answers.

        Raises:
            BackendUnavailableError: the daemon cannot be started or does not answer (one line,
                within the daemon's timeout).
        """
        try:
            self.daemon(ctx).start()
        except MpsError as exc:
            raise BackendUnavailableError(f"cuda-mps: {exc}") from None
        self.probe_mps(ctx)

    def probe_mps(self, ctx: AgentContext) -> str | None:
        """Run one short MPS client of this agent's daemon at :data:`~workers.backends.gpu_mps.PROBE_SHARE`
        % and check that it sees fewer SMs than the GPU has
        (:func:`~workers.backends.gpu_mps.probe_verdict`). If it does not (or the probe fails:
        no GPU, no torch), every later ``mps`` round and profiling configuration is refused
        with that reason; ``timeslice`` ones still run. Takes the seconds of importing torch
        and creating a CUDA context, once per agent.

        Returns:
            ``None`` when MPS applies shares here, else the refusal (also logged).
        """
        try:
            uuid = self.gpu_info().uuid
            total = self.gpu_info(probe=True).sm_count
            env = self.daemon(ctx).client_env(PROBE_SHARE)
        except BackendUnavailableError as exc:
            seen, total, error = None, None, str(exc)
        else:
            seen, error = gpu.probe_mps_client(uuid, env)
        self._mps_refusal = probe_verdict(seen, total, error)
        self._probed = True
        if self._mps_refusal is None:
            logger.info("cuda-mps: an MPS probe client at %d %% saw %s of %s SMs", PROBE_SHARE, seen, total)
        else:
            logger.warning("cuda-mps: mps rounds will be refused: %s", self._mps_refusal)
        return self._mps_refusal

    def stop(self) -> None:
        """Kill the warm trainers, then quit the MPS control daemon if this backend started it
        (it waits for its clients to exit); logs, never raises."""
        super().stop()
        if self._daemon is None:
            return
        try:
            self._daemon.stop()
        except MpsError as exc:
            logger.error("cuda-mps: could not stop the MPS control daemon: %s", exc)

    def prepare_dispatch(self, partitioning: Partitioning, ctx: AgentContext) -> None:
        """Restart the daemon if the previous dispatch failed; start it if an MPS dispatch
        finds it stopped (and run the MPS probe, :meth:`probe_mps`, if it never ran); remember
        where the server logs end.

        Raises:
            BackendUnavailableError: the daemon cannot be (re)started, or the MPS probe showed
                that shares do not apply here (for an ``mps`` dispatch; one line).
        """
        self._restarted = False
        try:
            daemon = self.daemon(ctx)
            if self._restart_pending and daemon.started:
                logger.warning("cuda-mps: restarting the MPS daemon after a failed dispatch")
                # Idle warm trainers are the daemon's clients: it would wait for them to exit.
                self.close_warm_pool()
                daemon.restart()
                self._restarted = True
                self._clients = {}
            elif partitioning == "mps" and not daemon.answering:
                # Half-way up (an earlier start timed out): quit what may be there first.
                self.close_warm_pool()
                self._clients = {}
                daemon.restart() if daemon.started else daemon.start()
        except MpsError as exc:
            raise BackendUnavailableError(f"cuda-mps: {exc}") from None
        self._restart_pending = False
        if partitioning == "mps" and not self._probed:
            self.probe_mps(ctx)
        if partitioning == "mps" and self._mps_refusal is not None:
            raise BackendUnavailableError(f"cuda-mps: mps rounds refused: {self._mps_refusal}")
        self._log_marks = daemon.log_marks()

    def kill_hook(self, partitioning: Partitioning) -> Callable[[Sequence[int]], object] | None:
        """Under ``mps``: end trainers about to be killed with ``terminate_client``
        (:meth:`~workers.backends.gpu_mps.MpsDaemon.terminate_clients`) first."""
        if partitioning != "mps" or self._daemon is None:
            return None
        return self._daemon.terminate_clients

    def finish_dispatch(self, ctx: AgentContext, *, failed: bool) -> None:
        """After a failed dispatch, mark the daemon for a restart before the next one."""
        if failed:
            self._restart_pending = True

    def resources_for_shares(
        self, shares: Sequence[int], partitioning: Partitioning, ctx: AgentContext
    ) -> list[TrainerResources]:
        """``mps``: each trainer an MPS client with its share; ``timeslice``: plain contexts.

        Pinned memory limits come from the round's assignments (:meth:`trainer_resources`);
        profiling configurations have none.

        Raises:
            ValueError: for a share outside ``[1, 100]`` (naming ``shares[k]``), more than
                :data:`~workers.backends.gpu_mps.MPS_MAX_CLIENTS` MPS clients, or an unknown
                partitioning.
        """
        return self._resources(shares, [None] * len(shares), partitioning, ctx)

    def trainer_resources(self, request: TrainRoundRequest, ctx: AgentContext) -> list[TrainerResources]:
        """Each assignment's trainer, with its ``memory_limit_bytes`` as its MPS pinned device
        memory limit.

        Raises:
            ValueError: as :meth:`resources_for_shares`.
        """
        return self._resources(
            [a.active_thread_percentage for a in request.assignments],
            [a.memory_limit_bytes for a in request.assignments],
            request.partitioning,
            ctx,
        )

    def _resources(
        self, shares: Sequence[int], limits: Sequence[int | None], partitioning: Partitioning, ctx: AgentContext
    ) -> list[TrainerResources]:
        self._check_shares(shares)
        if partitioning == "timeslice":
            return self._timeslice_resources(len(shares), ctx)
        if partitioning != "mps":
            raise ValueError(f"partitioning {partitioning!r} is unknown; allowed: 'timeslice', 'mps'")
        if len(shares) > MPS_MAX_CLIENTS:
            raise ValueError(f"{len(shares)} MPS clients requested; a GPU serves at most {MPS_MAX_CLIENTS}")
        try:
            daemon = self.daemon(ctx)
        except BackendUnavailableError as exc:
            raise ValueError(str(exc)) from None
        threads = self._threads(ctx, len(shares))
        base = {
            "CUDA_VISIBLE_DEVICES": self.gpu_info().uuid,
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            ENV_TRAINER_DEVICE: "cuda",
        }
        return [
            TrainerResources(
                threads=threads, cores=list(ctx.cores) or None, env={**base, **daemon.client_env(share, limit)}
            )
            for share, limit in zip(shares, limits, strict=True)
        ]

    def review_round(
        self, request: TrainRoundRequest, ctx: AgentContext, pids: Sequence[int | None], results: list[AssignmentResult]
    ) -> list[AssignmentResult]:
        """Under ``mps``: record whether each trainer got its share, from the SM count it
        reported against the GPU's (:func:`~workers.backends.gpu_mps.verify_client_sms`), with
        the MPS server log's connection line as the evidence at 100 % (``mps_verified``,
        ``mps_active_thread_percentage``: the SMs it saw as a percentage of the GPU's,
        ``mps_detail``). A warm trainer's connection line may be from an earlier round of the
        same daemon: every connection since the daemon started counts."""
        if request.partitioning != "mps" or self._daemon is None:
            return results
        log = read_server_log(self._daemon.server_logs(), self._log_marks)
        self._clients.update(log.client_server)
        pool = self._warm_pool
        # Only a warm trainer connected before this round: a new process's pid may be a reused one.
        warm = set(pool.pids()) if pool is not None else set()
        try:
            total = self.gpu_info().sm_count
        except BackendUnavailableError:
            total = None
        reviewed = []
        for assignment, pid, result in zip(request.assignments, pids, results, strict=True):
            applied, verified, detail = verify_client_sms(
                result.visible_sm_count,
                total,
                assignment.active_thread_percentage,
                connected_to=client_server(log, pid)
                or (self._clients.get(pid) if pid is not None and pid in warm else None),
            )
            reviewed.append(
                result.model_copy(
                    update={
                        "mps_active_thread_percentage": applied,
                        "mps_verified": verified,
                        "mps_detail": detail,
                    }
                )
            )
        return reviewed

    def run_round(self, request: TrainRoundRequest, ctx: AgentContext) -> DeviceRoundResult:
        """The GPU round (with telemetry); ``mps_restarted`` says the daemon was restarted
        before it because the previous dispatch failed."""
        self._restarted = False
        result = super().run_round(request, ctx)
        return result.model_copy(update={"mps_restarted": self._restarted})
