"""Agents on other hosts: weights over HTTP instead of a shared ``ARTIFACT_ROOT``.

With ``MTFL_CONTROL_URL`` and ``MTFL_AGENT_TOKEN`` (or ``MTFL_AGENT_TOKEN_FILE``) set, an agent
shares no disk with the control plane. Before a round it downloads the global models its
assignments start from into its own folder (``<state-dir>/artifacts``), checking each file's
SHA-256 against the control plane's ``X-Content-SHA256`` and its safetensors header; the trainers
read them there as usual; after the round it uploads each trained file to the control plane
under the assignment's ``output_weights`` key and reports that key, so the control plane's
FedAvg reads it from its own ``ARTIFACT_ROOT``. A download or upload that fails makes the
device's round fail, with one line saying which file and why (its weights never reach FedAvg).
With the variables unset nothing here runs: the agent reads and writes ``ARTIFACT_ROOT`` as
before.

HTTP goes through :mod:`urllib.request` (no extra dependency), streamed in 1 MiB chunks both
ways. Connection errors, timeouts, a body cut short and 502/503/504 answers are retried with
exponential backoff and jitter; other HTTP errors are final and quote the control plane's
message. The key is sent as ``Authorization: Agent <key>`` and never logged.

The retry loop (:meth:`ArtifactClient._call`) is this module's own rather than urllib3's
``Retry`` or httpx's, because neither covers the failure that matters most for weights files:
a download whose connection drops after the headers, while the body streams to disk. urllib3
retries only until it hands back the response; a body streamed with ``preload_content=False``
and cut after 1 of 4 MiB raises ``ProtocolError`` after one request, untried again (urllib3
2.8). httpx's transport retries only failed connects (``ConnectError``, ``ConnectTimeout``),
not answers such as 503. urllib3's backoff also makes the first retry at once (0 s, then
2 s, 4 s, ... for a factor of 1), which spends a try on a control plane that is restarting.
Using either would still need this loop around it, with two retry counts to reconcile.

This module imports neither torch nor Django.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import random
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.client import HTTPResponse
from pathlib import Path
from typing import TypeVar

from workers.fl.artifacts import (
    InvalidSafetensorsError,
    atomic_write_path,
    read_safetensors_header,
    sha256_file,
    validate_key,
)
from workers.protocol.messages import AssignmentResult, DeviceRoundResult, TrainRoundRequest

logger = logging.getLogger(__name__)

T = TypeVar("T")

ENV_CONTROL_URL = "MTFL_CONTROL_URL"
ENV_AGENT_TOKEN = "MTFL_AGENT_TOKEN"
ENV_AGENT_TOKEN_FILE = "MTFL_AGENT_TOKEN_FILE"

SHA256_HEADER = "X-Content-SHA256"
CHUNK_BYTES = 1 << 20
RETRY_STATUSES = frozenset({502, 503, 504})


class TransferError(RuntimeError):
    """A download or upload failed for good; the message is one line saying what and why.

    Attributes:
        status: the HTTP status of the final answer, or ``None`` when no answer came.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class TransferSettings:
    """Where the control plane is and the key this agent presents there.

    Attributes:
        control_url: the control plane's base URL, e.g. ``https://mtfl.lab.example`` (no
            trailing slash).
        token: the device's agent token (``mtfl device-token DEVICE``).
    """

    control_url: str
    token: str = field(repr=False)


def transfer_settings() -> TransferSettings | None:
    """Read :class:`TransferSettings` from the environment; ``None`` when ``MTFL_CONTROL_URL`` is
    unset (the shared-disk mode).

    The token comes from ``MTFL_AGENT_TOKEN``, else from the file ``MTFL_AGENT_TOKEN_FILE`` names
    (its content stripped).

    Raises:
        RuntimeError: one line naming the variable: a token without a URL or the reverse, a URL
            that is not ``http(s)://host…``, an unreadable token file.
    """
    url = os.environ.get(ENV_CONTROL_URL, "").strip()
    token = os.environ.get(ENV_AGENT_TOKEN, "").strip()
    token_file = os.environ.get(ENV_AGENT_TOKEN_FILE, "").strip()
    if not token and token_file:
        try:
            token = Path(token_file).expanduser().read_text().strip()
        except OSError as exc:
            raise RuntimeError(f"{ENV_AGENT_TOKEN_FILE}={token_file!r} cannot be read: {exc.strerror or exc}") from None
    if not url:
        if token:
            raise RuntimeError(
                f"an agent token is set but {ENV_CONTROL_URL} is not: set both (agents on other "
                "hosts) or neither (shared ARTIFACT_ROOT)"
            )
        return None
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RuntimeError(f"{ENV_CONTROL_URL}={url!r} is not an http(s) URL like https://mtfl.lab.example")
    if not token:
        raise RuntimeError(
            f"{ENV_CONTROL_URL} is set but the agent token is not: set {ENV_AGENT_TOKEN} (or "
            f"{ENV_AGENT_TOKEN_FILE}) to the key `mtfl device-token DEVICE` printed"
        )
    return TransferSettings(url.rstrip("/"), token)


class ArtifactClient:
    """The agent's side of ``/api/agent/`` on the control plane.

    Args:
        settings: the control plane's URL and the agent token.
        attempts: tries per request before giving up on connection errors and 502/503/504.
        backoff_s: the wait after the first failed try; doubled each time (plus up to 50 %
            jitter), at most ``max_backoff_s``.
        timeout_s: socket timeout of each try, seconds.
        sleep: how to wait (tests pass a recorder).
    """

    def __init__(
        self,
        settings: TransferSettings,
        *,
        attempts: int = 5,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        timeout_s: float = 60.0,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.settings = settings
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.timeout_s = timeout_s
        self._sleep = sleep or time.sleep
        self.max_artifact_bytes: int | None = None

    def __repr__(self) -> str:
        return f"ArtifactClient({self.settings.control_url!r})"

    def url(self, path: str) -> str:
        """The absolute URL of ``/api/agent/<path>`` (``path`` percent-encoded, ``/`` kept)."""
        return f"{self.settings.control_url}/api/agent/{urllib.parse.quote(path)}"

    # ------------------------------------------------------------------------------ calls

    def whoami(self) -> str:
        """Return the name of the device the token belongs to, and remember the largest upload
        the control plane takes (:attr:`max_artifact_bytes`).

        Raises:
            TransferError: the control plane refused the token (``status`` 401) or could not
                be reached, or answered something else than the agent API.
        """

        def read(response: HTTPResponse) -> str:
            try:
                answer = json.loads(response.read().decode("utf-8"))
                name = str(answer["name"])
            except (ValueError, KeyError, TypeError):
                raise TransferError(f"{self.url('device/')} did not answer like an mtfl-lab control plane") from None
            limit = answer.get("max_artifact_bytes")
            self.max_artifact_bytes = limit if isinstance(limit, int) else None
            return name

        return self._call("GET", "device/", "check the agent token", read)

    def download(self, key: str, dest: Path | str) -> str:
        """Fetch the artifact ``key`` into ``dest`` (atomically) and return its hex SHA-256.

        The body is streamed to a temporary file beside ``dest`` while hashed; it is moved onto
        ``dest`` only if its SHA-256 equals the control plane's ``X-Content-SHA256`` and its
        safetensors header is well-formed. A body that ends before its ``Content-Length`` (the
        connection dropped mid-file) is tried again like a connection error.

        Raises:
            TransferError: refused (404: not an artifact this device needs), unreachable or cut
                short on every try, a SHA-256 mismatch or a malformed file.
            ValueError: ``key`` is not a valid artifact key.
        """
        key = validate_key(key)
        dest = Path(dest)

        def read(response: HTTPResponse) -> str:
            expected = (response.headers.get(SHA256_HEADER) or "").strip().lower()
            announced = response.headers.get("Content-Length")
            with atomic_write_path(dest) as tmp:
                digest = hashlib.sha256()
                received = 0
                with open(tmp, "wb") as out:
                    for chunk in iter(lambda: response.read(CHUNK_BYTES), b""):
                        digest.update(chunk)
                        out.write(chunk)
                        received += len(chunk)
                # http.client ends a body whose connection closed early without an error
                if announced and announced.isdigit() and received < int(announced):
                    raise ConnectionError(f"the body ended after {received} of {announced} bytes")
                got = digest.hexdigest()
                if expected and got != expected:
                    raise TransferError(
                        f"download {key}: sha256 mismatch: got {got}, the control plane announced {expected}"
                    )
                try:
                    read_safetensors_header(tmp)
                except InvalidSafetensorsError as exc:
                    raise TransferError(f"download {key}: not a valid safetensors file: {exc}") from None
            return got

        return self._call("GET", f"artifacts/{key}", f"download {key}", read)

    def upload(self, key: str, source: Path | str, sha256: str | None = None) -> str:
        """Send the file ``source`` to the control plane under ``key``; return its hex SHA-256.

        The file is streamed (``Content-Length`` and ``X-Content-SHA256`` sent first); the
        control plane checks size, hash and safetensors header before storing it.

        Args:
            key: the assignment's ``output_weights`` key.
            source: the local weights file.
            sha256: its hex SHA-256 if known (checked against the file), else computed.

        Raises:
            TransferError: refused (the control plane's reason quoted), unreachable, or the
                file's SHA-256 differs from ``sha256``.
            FileNotFoundError: ``source`` does not exist.
        """
        key = validate_key(key)
        source = Path(source)
        size = source.stat().st_size
        actual = sha256_file(source)
        if sha256 and sha256.lower() != actual:
            raise TransferError(f"upload {key}: the local file's sha256 is {actual}, the trainer reported {sha256}")
        # Refused before sending: a server that answers 413 mid-body cuts the connection, which
        # would read as a network failure here.
        if self.max_artifact_bytes is not None and size > self.max_artifact_bytes:
            raise TransferError(
                f"upload {key}: the file is {size} bytes; the control plane takes at most "
                f"{self.max_artifact_bytes} (MTFL_MAX_ARTIFACT_BYTES)",
                413,
            )
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(size), SHA256_HEADER: actual}

        def read(response: HTTPResponse) -> str:
            return str(json.loads(response.read().decode("utf-8")).get("sha256", actual))

        return self._call("PUT", f"artifacts/{key}", f"upload {key}", read, headers=headers, body_path=source)

    # ---------------------------------------------------------------------------- plumbing

    def _call(
        self,
        method: str,
        path: str,
        what: str,
        read: Callable[[HTTPResponse], T],
        *,
        headers: dict[str, str] | None = None,
        body_path: Path | None = None,
    ) -> T:
        """Send one request, retrying transient failures; ``read(response)`` makes the result."""
        url = self.url(path)
        all_headers = {"Authorization": f"Agent {self.settings.token}", "Accept": "application/json", **(headers or {})}
        last = ""
        for attempt in range(1, self.attempts + 1):
            body = open(body_path, "rb") if body_path is not None else None  # noqa: SIM115 - closed below
            try:
                request = urllib.request.Request(url, data=body, method=method, headers=all_headers)
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return read(response)
            except urllib.error.HTTPError as exc:
                message = _error_message(exc)
                if exc.code not in RETRY_STATUSES:
                    raise TransferError(f"{what}: {url} answered HTTP {exc.code}: {message}", exc.code) from None
                last = f"HTTP {exc.code}: {message}"
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as exc:
                reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
                last = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
            finally:
                if body is not None:
                    body.close()
            if attempt < self.attempts:
                wait = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * (1 + random.random() / 2)
                logger.warning("%s failed (%s); try %d of %d in %.1f s", what, last, attempt + 1, self.attempts, wait)
                self._sleep(wait)
        raise TransferError(
            f"{what}: control plane at {self.settings.control_url} unreachable after {self.attempts} tries: {last}"
        )


def _error_message(exc: urllib.error.HTTPError) -> str:
    """The control plane's one-line message (``{"message": ...}``), else the reason phrase."""
    try:
        body = exc.read(64 * 1024).decode("utf-8", errors="replace")
    except OSError:
        body = ""
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or exc.reason or body.strip()[:200] or "no reason given")


# ---------------------------------------------------------------------------------- rounds


def run_round_remote(
    run_round: Callable[[TrainRoundRequest], DeviceRoundResult],
    request: TrainRoundRequest,
    artifact_root: Path,
    client: ArtifactClient,
) -> DeviceRoundResult:
    """Run a device's round with its weights fetched from and sent to the control plane.

    1. Download every distinct ``global_weights`` of the request into ``artifact_root``.
    2. ``run_round(request)``: the backend, its trainers reading and writing
       ``artifact_root``.
    3. Upload every succeeded assignment's ``weights`` under that same key.
    4. Remove the files of this round from ``artifact_root``.

    Never raises: a failed download fails the round before anything trains; a failed upload
    marks that assignment failed and the device's round failed (so none of its weights enter
    FedAvg), the message naming the file and why.

    Args:
        run_round: the backend's round (its context's ``artifact_root`` is ``artifact_root``).
        request: the round.
        artifact_root: this agent's own artifact folder (``<state-dir>/artifacts``).
        client: the control plane.
    """

    def failed(error: str, assignments: list[AssignmentResult] | None = None) -> DeviceRoundResult:
        return DeviceRoundResult(
            run_id=request.run_id,
            round_id=request.round_id,
            device=request.device,
            status="failed",
            error=error,
            host=socket.gethostname(),
            assignments=assignments or [],
        )

    local: set[Path] = set()
    try:
        for key in sorted({a.global_weights for a in request.assignments}):
            path = artifact_root / validate_key(key)
            local.add(path)
            try:
                client.download(key, path)
            except (TransferError, ValueError, OSError) as exc:
                return failed(f"cannot fetch the global weights: {exc}")
        result = run_round(request)
        assignments, problems = [], []
        for item in result.assignments:
            if item.status != "succeeded" or not item.weights:
                assignments.append(item)
                continue
            path = artifact_root / validate_key(item.weights)
            local.add(path)
            try:
                client.upload(item.weights, path, item.weights_sha256)
            except (TransferError, OSError) as exc:
                problems.append(f"task {item.task_id}: cannot send the trained weights: {exc}")
                item = item.model_copy(update={"status": "failed", "error": problems[-1]})
            assignments.append(item)
        if problems:
            error = "; ".join([result.error, *problems] if result.error else problems)
            return result.model_copy(update={"status": "failed", "error": error, "assignments": assignments})
        return result.model_copy(update={"assignments": assignments})
    except Exception as exc:  # failures are data; the chord callback must run
        logger.exception("round %s of run %s failed in the transfer", request.round_index, request.run_id)
        return failed(f"{type(exc).__name__}: {exc}")
    finally:
        _remove(local, artifact_root)


def _remove(paths: set[Path], root: Path) -> None:
    """Delete a round's local files and the folders they leave empty (up to ``root``)."""
    for path in paths:
        try:
            path.unlink(missing_ok=True)
            parent = path.parent
            while parent != root and root in parent.parents and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
        except OSError:
            logger.warning("could not remove %s", path, exc_info=True)
