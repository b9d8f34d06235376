"""The agent's own NVIDIA MPS control daemon, the environment of its clients, and its logs.

docs/DESIGN.md §2 ("MPS facts") shapes this module:

- each agent runs a private control daemon (``nvidia-cuda-mps-control -d``) whose
  ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` live under the agent's state
  directory, so two agents (or a system-wide daemon) never share one;
- a client's share is fixed when its process starts, and the client's
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` can only tighten the server's default: so the daemon is
  started with *no* share or memory limit of its own (inherited ``CUDA_MPS_*`` limits are
  stripped from its environment) and each trainer gets its own in :meth:`MpsDaemon.client_env`;
- a fatal fault in one client reaches every client of the server, and the server refuses new
  clients until all have exited: after a failed dispatch the backend restarts the daemon
  (:meth:`MpsDaemon.restart`) before the next one;
- 48 clients per GPU on Volta and later (:data:`MPS_MAX_CLIENTS`);
- every call to the daemon has a timeout: a daemon that does not answer, or a pipe directory
  held by another user, is a :class:`MpsError` with one line saying what to do, never a hang.

Whether a trainer really got its share is judged from inside it (:func:`verify_client_sms`):
the SM count its CUDA context reports (``multi_processor_count``), which MPS lowers to the
client's active thread percentage, against the count that share should leave. The server log
cannot say it: current drivers log client connections and one server-level percentage, never a
client's own share, and a client that cannot reach the daemon silently runs as a plain CUDA
context ("continues to run as it normally would without MPS", ``nvidia-cuda-mps-control(1)``).
The log still shows which trainers connected (:func:`read_server_log`), the only evidence for a
share of 100 %, where the SM count cannot drop. The server-log lines this reads look like::

    [2026-04-28 18:20:41.986 Server 4428] Active Threads Percentage set to 100.0
    [2026-04-28 18:20:41.986 Server 4428] Client {PID: 4267, Context ID: 0} connected
    [2013-08-05 13:00:09.269 Server 13929] New client 14781 connected          (older drivers)

A line naming a client together with an active thread percentage is used as that client's own
share when a driver writes one.

Ending things: a trainer that must be killed under MPS is first ended with ``terminate_client``
(:meth:`MpsDaemon.terminate_clients`, the documented way to end a client's GPU work); a daemon
that does not exit within the timeout of ``quit`` is killed with its servers
(:meth:`MpsDaemon.stop`). A daemon re-parented to a process that never reaps it (PID 1 of a
container without an init) stays a zombie: a zombie counts as gone (:func:`pid_alive`). This
module imports neither torch nor pynvml.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

MPS_MAX_CLIENTS = 48
"""Most MPS clients one GPU serves at once on Volta and later GPUs (docs/DESIGN.md §2: 48-60,
depending on the driver and ``CUDA_DEVICE_MAX_CONNECTIONS``; 48 is the bound every Volta+
driver honours). Pre-Volta GPUs serve 16 and have no per-client share at all."""

ENV_MPS_CONTROL = "MTFL_MPS_CONTROL"
"""Path (or name on ``PATH``) of ``nvidia-cuda-mps-control``; default: found on ``PATH``."""

CONTROL_BINARY = "nvidia-cuda-mps-control"
ENV_MPS_TIMEOUT_S = "MTFL_MPS_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 10.0
"""Seconds one call to the control daemon (start, a query, quit) may take by default."""

UNIX_PATH_MAX = 107
"""Longest unix socket path (``sockaddr_un.sun_path`` less its terminating NUL)."""
# The daemon creates sockets in the pipe directory ("control", "control_privileged"); this
# leaves room for the longest name and its slash.
_SOCKET_NAME_ROOM = 20

MPS_SM_GRANULARITY = 2
"""SMs MPS grants a client's share in on Volta and later GPUs: SMs come in pairs (a TPC), so
the count a client sees is its share of the SMs rounded to a multiple of 2 (the tolerance of
:func:`verify_client_sms`)."""

PROBE_SHARE = 50
"""Active thread percentage of the agent's start-up probe client (:func:`probe_verdict`)."""

KILL_WAIT_S = 2.0
"""Seconds to wait for a killed daemon or server to go, and for one ``terminate_client``."""

_MPS_ENV_PREFIX = "CUDA_MPS_"
_LIMIT_VARIABLES = ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")


class MpsError(RuntimeError):
    """The MPS control daemon cannot be started, reached or stopped; one line saying why."""


class MpsNoAnswerError(MpsError):
    """The control daemon did not answer within the timeout."""


def control_binary() -> str | None:
    """Return the control binary to run (``MTFL_MPS_CONTROL`` or ``nvidia-cuda-mps-control`` on
    ``PATH``), as an absolute path, or ``None`` if it cannot be found."""
    name = os.environ.get(ENV_MPS_CONTROL, "").strip() or CONTROL_BINARY
    return shutil.which(name)


def timeout_from_env() -> float:
    """Seconds one call to the daemon may take: ``MTFL_MPS_TIMEOUT_S`` (default 10).

    Raises:
        ValueError: naming the variable, for a value that is not a number in ``(0, 600]``.
    """
    text = os.environ.get(ENV_MPS_TIMEOUT_S, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 600):
        raise ValueError(f"{ENV_MPS_TIMEOUT_S}={text!r} is out of range: allowed (0, 600] seconds")
    return value


def pinned_memory_limit(limit_bytes: int) -> str:
    """The ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` value limiting device 0 (the only device a
    trainer sees: its GPU by UUID) to ``limit_bytes``, rounded up to MiB.

    Example:
        >>> pinned_memory_limit(3 * 2**30 + 1)
        '0=3073MB'

    Raises:
        ValueError: for ``limit_bytes < 1``.
    """
    if limit_bytes < 1:
        raise ValueError(f"memory_limit_bytes must be >= 1, got {limit_bytes}")
    return f"0={math.ceil(limit_bytes / 2**20)}MB"


def _tail(path: Path, chars: int = 600) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs; a zombie (exited, not yet reaped) counts as gone.

    The MPS control daemon forks into the background and is re-parented to PID 1; in a
    container without an init process nothing reaps it, and ``kill(pid, 0)`` keeps answering
    for its zombie: its state in ``/proc/<pid>/stat`` (``Z``, or ``X``) says it is dead.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    return _proc_state(pid) not in ("Z", "X")


def child_pids(pid: int) -> list[int]:
    """The process ids whose parent is ``pid`` (from ``/proc/<id>/stat``); ``[]`` without ``/proc``.

    The MPS control daemon starts its servers itself, so they are its children.
    """
    children = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # exited meanwhile
        if len(fields) > 1 and fields[1] == str(pid):
            children.append(int(entry.parent.name))
    return sorted(children)


def _proc_state(pid: int) -> str:
    """The one-letter state of ``/proc/<pid>/stat`` (``R``, ``S``, ``Z``...), ``""`` if unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name is in parentheses and may hold spaces: the state follows the last ")".
    rest = stat.rpartition(")")[2].split()
    return rest[0] if rest else ""


@dataclass
class MpsDaemon:
    """One agent's private MPS control daemon for one GPU.

    Args:
        binary: the control binary (:func:`control_binary`).
        pipe_dir: ``CUDA_MPS_PIPE_DIRECTORY`` of the daemon and its clients; its path plus a
            socket name must fit a unix socket path (:data:`UNIX_PATH_MAX`).
        log_dir: ``CUDA_MPS_LOG_DIRECTORY`` (``control.log``, ``server.log``).
        gpu_uuid: the only GPU the daemon's servers see (``CUDA_VISIBLE_DEVICES``).
        timeout_s: seconds any one call to the daemon may take, ``> 0``.

    Methods raise :class:`MpsError` (one line) instead of hanging. :attr:`started` is true
    from the moment ``-d`` is run until :meth:`stop` (so a daemon half-way up is still quit);
    :attr:`answering` only once it answered.
    """

    binary: str
    pipe_dir: Path
    log_dir: Path
    gpu_uuid: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    started: bool = False
    answering: bool = False
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    @property
    def _control_socket(self) -> Path:
        return self.pipe_dir / "control"

    @property
    def _pid_file(self) -> Path:
        return self.pipe_dir / "nvidia-cuda-mps-control.pid"

    def daemon_env(self) -> dict[str, str]:
        """The daemon's environment: the agent's, less any inherited ``CUDA_MPS_*`` setting
        (a daemon-wide share or memory limit would cap every client), plus its private
        directories and its one GPU."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(_MPS_ENV_PREFIX)}
        env.update(
            CUDA_MPS_PIPE_DIRECTORY=str(self.pipe_dir),
            CUDA_MPS_LOG_DIRECTORY=str(self.log_dir),
            CUDA_VISIBLE_DEVICES=self.gpu_uuid,
        )
        return env

    def client_env(self, active_thread_percentage: int, memory_limit_bytes: int | None = None) -> dict[str, str]:
        """The MPS variables of one trainer: this daemon's directories and the trainer's own
        share (and pinned memory limit when set), read by CUDA when the trainer initialises it.

        Args:
            active_thread_percentage: the trainer's share, integer in ``[1, 100]``.
            memory_limit_bytes: device memory the trainer may pin, or ``None``.

        Raises:
            ValueError: for a share outside ``[1, 100]`` or a limit below 1 byte.
        """
        share = active_thread_percentage
        if isinstance(share, bool) or not isinstance(share, int) or not 1 <= share <= 100:
            raise ValueError(f"active_thread_percentage must be an integer in [1, 100] (percent), got {share!r}")
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(share),
        }
        if memory_limit_bytes is not None:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = pinned_memory_limit(memory_limit_bytes)
        return env

    # ------------------------------------------------------------------------------ calls

    def query(self, command: str, timeout_s: float | None = None) -> str:
        """Send one command to the daemon (``echo COMMAND | nvidia-cuda-mps-control``).

        Returns:
            What the daemon printed.

        Raises:
            MpsNoAnswerError: no answer within ``timeout_s`` (default :attr:`timeout_s`).
            MpsError: the command failed (its exit code and output quoted).
        """
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            done = subprocess.run(
                [self.binary],
                input=f"{command}\n",
                env=self.daemon_env(),
                capture_output=True,
                text=True,
                timeout=limit,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise MpsNoAnswerError(
                f"the MPS control daemon at {self.pipe_dir} did not answer `{command}` within {limit:g} s"
            ) from None
        except OSError as exc:
            raise MpsError(f"cannot run {self.binary}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            said = " ".join((done.stderr.strip() or done.stdout.strip()).split())[-300:]
            raise MpsError(
                f"`{command}` to the MPS control daemon at {self.pipe_dir} failed (exit "
                f"{done.returncode}){': ' + said if said else ''}"
            )
        return done.stdout

    def answers(self) -> bool:
        """Whether a daemon is listening in :attr:`pipe_dir` and answers ``get_server_list``.

        Raises:
            MpsNoAnswerError: a daemon is there but does not answer within the timeout.
        """
        if not self._control_socket.exists():
            return False
        try:
            self.query("get_server_list")
        except MpsNoAnswerError:
            raise
        except MpsError:
            return False
        return True

    def _check_paths(self) -> None:
        longest = len(str(self.pipe_dir)) + _SOCKET_NAME_ROOM
        if longest > UNIX_PATH_MAX:
            raise MpsError(
                f"the MPS pipe directory {str(self.pipe_dir)!r} is too long for unix sockets "
                f"({len(str(self.pipe_dir))} + {_SOCKET_NAME_ROOM} > {UNIX_PATH_MAX} bytes): "
                "start the agent with a shorter --state-dir"
            )
        for path in (self.pipe_dir, self.log_dir, self._control_socket):
            try:
                owner = path.stat().st_uid
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise MpsError(f"cannot inspect {path}: {exc.strerror or exc}") from None
            if owner != os.geteuid():
                raise MpsError(
                    f"{path} belongs to uid {owner} but this agent runs as uid {os.geteuid()}: "
                    "an MPS daemon of another user holds this pipe directory; stop it "
                    f"(`echo quit | CUDA_MPS_PIPE_DIRECTORY={self.pipe_dir} {CONTROL_BINARY}` "
                    "as that user) or give this agent another --state-dir"
                )

    def start(self) -> None:
        """Start the daemon (``-d``) and wait until it answers ``get_server_list``.

        A daemon of this user already listening in :attr:`pipe_dir` (left by an agent that
        died) is told to quit first, so the servers this agent talks to are its own. A stale
        socket with no daemon behind it is removed.

        Raises:
            MpsError: the pipe directory is too long or belongs to another user, a daemon
                there does not answer, the binary fails, or the new daemon does not answer
                within :attr:`timeout_s`.
        """
        with self._lock:
            self.answering = False
            self._check_paths()
            self.pipe_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._check_paths()
            self._clear_pipe_dir()
            self._run_daemon()
            self._wait_until_answering()

    def _clear_pipe_dir(self) -> None:
        """Quit a daemon of this user answering in :attr:`pipe_dir`, or remove a stale socket.

        Raises:
            MpsError: a daemon there does not answer.
        """
        if self._control_socket.exists():
            try:
                if self.answers():
                    logger.warning(
                        "an MPS control daemon of this user already runs in %s; restarting it", self.pipe_dir
                    )
                    self._quit()
                else:
                    self._control_socket.unlink(missing_ok=True)
            except MpsNoAnswerError as exc:
                pid = _tail(self._pid_file, 20)
                raise MpsError(
                    f"{exc}: stop that daemon{' (pid ' + pid + ')' if pid else ''} or give "
                    "this agent another --state-dir"
                ) from None

    def _run_daemon(self) -> None:
        """Run ``nvidia-cuda-mps-control -d`` (it forks the daemon into the background and
        returns), its output to ``log_dir/mps-control.stderr``; :attr:`started` from here on.

        Raises:
            MpsNoAnswerError: the binary does not return within :attr:`timeout_s`.
            MpsError: it cannot run or fails (the message quotes its output or the control log).
        """
        stderr_path = self.log_dir / "mps-control.stderr"
        # Counted as started from here on: if the agent is stopped (SIGTERM) while the
        # daemon comes up, stop() must still try to quit it rather than orphan it.
        self.started = True
        try:
            with open(stderr_path, "wb") as stderr:
                # No pipes: the daemon forks into the background and would hold them open.
                done = subprocess.run(
                    [self.binary, "-d"],
                    env=self.daemon_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=stderr,
                    stderr=stderr,
                    timeout=self.timeout_s,
                    check=False,
                    start_new_session=True,
                )
        except subprocess.TimeoutExpired:
            raise MpsNoAnswerError(f"`{self.binary} -d` did not return within {self.timeout_s:g} s") from None
        except OSError as exc:
            self.started = False
            raise MpsError(f"cannot run {self.binary}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            self.started = False
            said = " ".join((_tail(stderr_path) or _tail(self.log_dir / "control.log")).split())
            raise MpsError(f"`{self.binary} -d` failed (exit {done.returncode}){': ' + said[-300:] if said else ''}")

    def _wait_until_answering(self) -> None:
        """Poll until the new daemon's control socket answers ``get_server_list``; then
        :attr:`answering`.

        Raises:
            MpsNoAnswerError: it does not within :attr:`timeout_s` (the message says the last
                problem seen).
        """
        deadline = time.monotonic() + self.timeout_s
        last = "its control socket never appeared"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise MpsNoAnswerError(
                    f"the MPS control daemon started in {self.pipe_dir} did not answer "
                    f"within {self.timeout_s:g} s ({last})"
                )
            if self._control_socket.exists():
                try:
                    self.query("get_server_list", timeout_s=left)
                except MpsNoAnswerError:
                    raise
                except MpsError as exc:
                    last = str(exc)
                else:
                    self.answering = True
                    logger.info("MPS control daemon answering in %s (GPU %s)", self.pipe_dir, self.gpu_uuid)
                    return
            time.sleep(0.05)

    def server_pids(self, timeout_s: float | None = None) -> list[int]:
        """The process ids of the MPS servers the daemon runs (``get_server_list``).

        Raises:
            MpsError: as :meth:`query`.
        """
        return [int(word) for word in self.query("get_server_list", timeout_s).split() if word.isdigit()]

    def terminate_clients(self, client_pids: Sequence[int]) -> list[int]:
        """End the GPU work of MPS clients about to be killed: ``terminate_client <server PID>
        <client PID>`` for each (``nvidia-cuda-mps-control(1)``: the documented way to end a
        client; a client killed with work in flight is a fault the server may deliver to every
        other client).

        Each call may take :data:`KILL_WAIT_S`; a daemon that does not answer ends the attempt.
        Never raises (logs why).

        Args:
            client_pids: the trainers' process ids.

        Returns:
            The pids a server accepted ``terminate_client`` for.
        """
        if not self.answering or not client_pids:
            return []
        try:
            servers = self.server_pids(timeout_s=KILL_WAIT_S)
        except MpsError as exc:
            logger.warning("cannot list MPS servers to terminate clients %s: %s", list(client_pids), exc)
            return []
        ended: list[int] = []
        for client in client_pids:
            for server in servers:
                try:
                    self.query(f"terminate_client {server} {client}", timeout_s=KILL_WAIT_S)
                except MpsNoAnswerError as exc:
                    logger.warning("terminate_client: %s", exc)
                    return ended
                except MpsError:
                    continue  # not a client of that server (or already gone)
                ended.append(client)
                break
        return ended

    def _daemon_pid(self) -> int | None:
        text = _tail(self._pid_file, 20)
        return int(text) if text.isdigit() else None

    def _gone(self, pid: int | None) -> bool:
        return not pid_alive(pid) if pid is not None else not self._control_socket.exists()

    def _quit(self) -> None:
        """Send ``quit`` and wait until the daemon is gone (its pid, else its socket); if it
        does not answer or exit within the timeout, kill its servers and itself."""
        pid = self._daemon_pid()
        # The daemon's servers are its children: known without asking a daemon that may be stuck.
        servers = child_pids(pid) if pid is not None else []
        try:
            self.query("quit")
        except MpsNoAnswerError as exc:
            reason = str(exc)
        else:
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                if self._gone(pid):
                    return
                time.sleep(0.05)
            reason = (
                f"the MPS control daemon in {self.pipe_dir} did not exit within {self.timeout_s:g} s "
                "of `quit` (clients still running?)"
            )
        self._kill(servers, pid, reason)

    def _kill(self, servers: Sequence[int], daemon_pid: int | None, reason: str) -> None:
        """Kill (SIGKILL) the MPS servers and the control daemon after a ``quit`` that failed.

        Raises:
            MpsNoAnswerError: the daemon's pid is unknown, or it is still there after
                :data:`KILL_WAIT_S`.
            MpsError: a process belongs to another user.
        """
        if daemon_pid is None:
            raise MpsNoAnswerError(f"{reason}; its pid is unknown ({self._pid_file} unreadable), so it was not killed")
        targets = [p for p in (*servers, daemon_pid) if pid_alive(p)]
        logger.warning("%s: killing MPS server(s) %s and control daemon %d", reason, list(servers), daemon_pid)
        for target in targets:
            try:
                # SIGKILL, not SIGTERM: a daemon that ignored `quit` is stuck, and the agent is
                # stopping or about to start a fresh one in the same pipe directory.
                os.kill(target, signal.SIGKILL)
            except ProcessLookupError:
                continue
            except PermissionError:
                raise MpsError(f"{reason}; pid {target} belongs to another user and cannot be killed") from None
        deadline = time.monotonic() + KILL_WAIT_S
        while any(pid_alive(p) for p in targets):
            if time.monotonic() > deadline:
                raise MpsNoAnswerError(f"{reason}; still there {KILL_WAIT_S:g} s after SIGKILL")
            time.sleep(0.05)
        # The killed daemon leaves its socket behind; start() would try to talk to it.
        self._control_socket.unlink(missing_ok=True)

    def stop(self) -> None:
        """Quit the daemon if this object started it (or was starting it); a no-op otherwise
        (idempotent).

        A daemon that does not answer ``quit`` or exit within the timeout is killed with its
        servers (logged).

        Raises:
            MpsError: the daemon could not be stopped even so (its pid unknown, another user's).
        """
        with self._lock:
            if not self.started:
                return
            self.started = self.answering = False
            self._quit()
            logger.info("MPS control daemon in %s stopped", self.pipe_dir)

    def restart(self) -> None:
        """Quit the daemon (and with it every MPS server and client state) and start it again.

        Raises:
            MpsError: as :meth:`stop` and :meth:`start`.
        """
        with self._lock:
            try:
                self.stop()
            except MpsError as exc:
                logger.warning("MPS daemon restart: %s", exc)
            self.start()

    # ------------------------------------------------------------------------------- logs

    def server_logs(self) -> list[Path]:
        """The ``server.log`` files under :attr:`log_dir` (one, or one per server folder)."""
        if not self.log_dir.is_dir():
            return []
        return sorted(self.log_dir.rglob("server.log"))

    def log_marks(self) -> dict[Path, int]:
        """Current size of each server log, bytes: pass to :func:`read_server_log` after a
        round to read only what the round's clients caused."""
        marks = {}
        for path in self.server_logs():
            try:
                marks[path] = path.stat().st_size
            except OSError:
                continue
        return marks


# --------------------------------------------------------------------------- server log

_LINE = re.compile(r"^\[(?P<stamp>[^\]]*?)\s+(?P<who>[A-Za-z][A-Za-z ]*?)\s+(?P<pid>\d+)\]\s*(?P<msg>.*)$")
_SERVER_SHARE = re.compile(r"active threads? percentage set to\s*(?P<pct>\d+(?:\.\d+)?)", re.I)
_CLIENT_CONNECTED = (
    re.compile(r"^Client \{PID:\s*(?P<cpid>\d+),\s*Context ID:\s*\d+\} connected", re.I),
    re.compile(r"^New client (?P<cpid>\d+) connected", re.I),
)
_CLIENT_SHARE = re.compile(r"client\b\D*?(?P<cpid>\d+).*?active threads? percentage\D*?(?P<pct>\d+(?:\.\d+)?)", re.I)


@dataclass
class MpsServerLog:
    """What the MPS server logs say about servers and clients.

    Attributes:
        server_share: per server pid, its active thread percentage (``Active Threads
            Percentage set to X``), percent.
        client_server: per client pid, the server pid it connected to.
        client_share: per client pid, its own active thread percentage when a line records it.
    """

    server_share: dict[int, float] = field(default_factory=dict)
    client_server: dict[int, int] = field(default_factory=dict)
    client_share: dict[int, float] = field(default_factory=dict)


def parse_server_log(text: str, log: MpsServerLog | None = None, *, clients: bool = True) -> MpsServerLog:
    """Parse MPS server log lines (format in the module docstring) into ``log``.

    Args:
        text: log text; lines that are not ``[stamp Who PID] message`` are skipped.
        log: the record to add to (a new one by default).
        clients: also record client connections and client shares (False: servers only).

    Returns:
        ``log``, updated.
    """
    log = MpsServerLog() if log is None else log
    for raw in text.splitlines():
        match = _LINE.match(raw.strip())
        if not match:
            continue
        pid, message = int(match["pid"]), match["msg"]
        if not message.lower().startswith("client") and (share := _SERVER_SHARE.search(message)):
            log.server_share[pid] = float(share["pct"])
            continue
        if not clients:
            continue
        for pattern in _CLIENT_CONNECTED:
            if connected := pattern.match(message):
                log.client_server[int(connected["cpid"])] = pid
                break
        else:
            if share := _CLIENT_SHARE.search(message):
                log.client_share[int(share["cpid"])] = float(share["pct"])
    return log


def read_server_log(paths: list[Path], marks: Mapping[Path, int] | None = None) -> MpsServerLog:
    """Read server logs: server shares from whole files, clients only past ``marks``.

    Args:
        paths: ``server.log`` files (:meth:`MpsDaemon.server_logs`).
        marks: per file, the byte offset where the round began (:meth:`MpsDaemon.log_marks`);
            files without a mark are read whole.

    Returns:
        The parsed :class:`MpsServerLog`; unreadable files are skipped (logged).
    """
    log = MpsServerLog()
    marks = marks or {}
    for path in paths:
        try:
            data = path.read_bytes()
        except OSError as exc:
            logger.warning("cannot read MPS server log %s: %s", path, exc)
            continue
        start = min(marks.get(path, 0), len(data))
        parse_server_log(data[:start].decode("utf-8", errors="replace"), log, clients=False)
        parse_server_log(data[start:].decode("utf-8", errors="replace"), log)
    return log


def share_sm_bounds(total_sms: int, share: int, granularity: int = MPS_SM_GRANULARITY) -> tuple[int, int]:
    """The SM counts a client of ``share`` percent may see on a GPU of ``total_sms`` SMs.

    MPS limits a client to ``share × total_sms / 100`` SMs, granted in units of
    ``granularity`` SMs (a TPC, :data:`MPS_SM_GRANULARITY`), so the count it reports lies within
    one unit of that product either way, and within ``[1, total_sms]``.

    Example:
        >>> share_sm_bounds(132, 50)
        (64, 68)

    Raises:
        ValueError: for ``total_sms < 1`` or a share outside ``[1, 100]``.
    """
    if total_sms < 1:
        raise ValueError(f"total_sms must be >= 1, got {total_sms}")
    if not 1 <= share <= 100:
        raise ValueError(f"share must be in [1, 100] (percent), got {share}")
    exact = total_sms * share / 100
    return max(1, math.floor(exact) - granularity), min(total_sms, math.ceil(exact) + granularity)


def verify_client_sms(
    seen_sms: int | None, total_sms: int | None, requested: int, *, connected_to: int | None = None
) -> tuple[float | None, bool, str]:
    """Check from inside a trainer that MPS applied its share: the SM count its CUDA context
    reported (``multi_processor_count``, which MPS lowers to the client's share) against the
    count that share leaves (:func:`share_sm_bounds`).

    A share below 100 % is verified when the trainer saw fewer SMs than the GPU has and no more
    nor fewer than the share allows (a server capped below the share shows as too few). At
    100 % the SM count cannot tell an MPS client from a plain CUDA context: the server log's
    connection line (``connected_to``) is then the evidence.

    Args:
        seen_sms: the trainer's ``visible_sm_count`` (``None``: it reported none).
        total_sms: the GPU's SMs (NVML or the probe outside MPS); ``None`` if unknown.
        requested: its ``active_thread_percentage``, ``[1, 100]``.
        connected_to: the MPS server the log shows it connected to (:func:`client_server`).

    Returns:
        ``(applied_share, verified, detail)``: ``applied_share`` is ``100 × seen / total``
        (percent; ``None`` when either count is missing); ``detail`` says what was seen.
    """
    via = f"; client of MPS server {connected_to}" if connected_to is not None else ""
    if seen_sms is None:
        return None, False, f"the trainer reported no SM count (it did not reach CUDA){via}"
    if not total_sms:
        return None, False, f"the trainer saw {seen_sms} SMs, but the GPU's SM count is unknown{via}"
    applied = round(100 * seen_sms / total_sms, 2)
    low, high = share_sm_bounds(total_sms, requested)
    seen = f"saw {seen_sms} of {total_sms} SMs ({applied:g} %) at a {requested} % share"
    if requested == 100:
        if seen_sms < total_sms:
            return applied, False, f"{seen}: fewer than the whole GPU (another limit applies){via}"
        if connected_to is None:
            return (
                applied,
                False,
                f"{seen}, but the MPS server log does not show it as a client: at 100 % the SM count "
                "cannot tell an MPS client from a plain CUDA context",
            )
        return applied, True, f"{seen}{via}"
    if seen_sms >= total_sms:
        return (
            applied,
            False,
            f"{seen}: MPS did not limit it (it ran as a plain CUDA context: no MPS daemon reached, "
            f"or a pre-Volta GPU){via}",
        )
    if not low <= seen_sms <= high:
        return applied, False, f"{seen}: outside the {low}-{high} SMs that share allows{via}"
    return applied, True, f"{seen}{via}"


def client_server(log: MpsServerLog, client_pid: int | None) -> int | None:
    """The MPS server the log shows ``client_pid`` connected to, or ``None``."""
    return None if client_pid is None else log.client_server.get(client_pid)


def probe_verdict(seen_sms: int | None, total_sms: int | None, error: str = "", share: int = PROBE_SHARE) -> str | None:
    """Judge the agent's start-up probe: a client of this agent's daemon at ``share`` percent
    must see fewer SMs than the GPU has, or MPS does not apply shares on this host.

    Args:
        seen_sms: the probe client's ``multi_processor_count`` (``None``: the probe failed).
        total_sms: the GPU's SMs.
        error: why the probe failed, when it did.
        share: the probe's active thread percentage.

    Returns:
        ``None`` when shares apply; otherwise one line saying why ``mps`` rounds are refused.
    """
    if seen_sms is None:
        return f"the MPS probe client ({share} %) could not read its SM count: {error or 'no answer'}"
    if not total_sms:
        return "the GPU's SM count is unknown, so the MPS probe client's cannot be judged"
    if seen_sms >= total_sms:
        return (
            f"a probe client at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={share} saw all {total_sms} SMs "
            f"({seen_sms}): MPS does not limit clients here (the client did not reach this agent's "
            "MPS daemon, or the GPU is older than Volta)"
        )
    return None
