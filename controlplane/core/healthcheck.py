"""Container healthchecks (docker-compose.yml), cheap and without Django.

``python -m controlplane.core.healthcheck web URL``
    GET ``URL`` (the web app's ``/healthz``, which queries the database) and require a 200. The
    request carries a ``Host`` header from ``ALLOWED_HOSTS`` (its first concrete name), so the
    check passes Django's host validation as a real client does, whatever the lab's host names.

``python -m controlplane.core.healthcheck worker NODE``
    The Celery worker named ``NODE`` (``control@<hostname>``) answers a control ``ping`` over the
    broker at ``CELERY_BROKER_URL``: what ``celery inspect ping -d NODE`` asks, from a bare Celery
    app, so the check imports neither Django nor the project's tasks (a fraction of the CPU time,
    which matters at a 10 s interval). The control worker's prefork pool answers while its
    children work.

``python -m controlplane.core.healthcheck agent``
    The device agent of this container holds its device lock (``$MTFL_AGENT_STATE_DIR/agent.lock``,
    taken by :func:`workers.agent.app.main` once its backend, broker and state folder checked out
    and held for the life of the process; read from ``/proc/locks``, so the check never takes
    the lock itself), and the broker at ``CELERY_BROKER_URL`` answers a Redis ``PING``. A Celery
    ``inspect ping`` is no use here: the agent's solo pool answers no control command while it
    trains a round, which would mark a working agent unhealthy for hours.

Exit status 0 when healthy; 1 otherwise, with one line on stderr saying what failed (Docker
keeps it in ``docker inspect``'s health log).
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

TIMEOUT_S = 5.0


class Unhealthy(Exception):
    """The checked service is not healthy; the message says why, in one line."""


def host_header(allowed_hosts: str) -> str | None:
    """The first concrete name of an ``ALLOWED_HOSTS`` value (``".lab.example"`` → ``"lab.example"``);
    ``None`` for an empty value or only ``*`` (any ``Host`` then passes)."""
    for host in (h.strip() for h in allowed_hosts.split(",")):
        if host and host != "*":
            return host.lstrip(".")
    return None


def check_web(url: str, *, allowed_hosts: str = "", timeout_s: float = TIMEOUT_S) -> str:
    """GET ``url`` with a ``Host`` allowed by ``allowed_hosts``; return the body of a 200.

    Raises:
        Unhealthy: no answer, or an answer other than 200.
    """
    request = urllib.request.Request(url)
    host = host_header(allowed_hosts)
    if host:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - our URL
            return response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip().replace("\n", " ")[:200]
        raise Unhealthy(f"{url} answered HTTP {exc.code}: {body}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unhealthy(f"{url} did not answer: {reason}") from None


def lock_is_held(path: Path, locks_text: str) -> bool:
    """Whether ``/proc/locks`` (its text) lists a lock on the file at ``path`` (matched by inode)."""
    inode = path.stat().st_ino
    for line in locks_text.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; blocked waiters read "1: -> FLOCK ...".
        if len(fields) >= 6 and fields[1] != "->" and fields[5].rsplit(":", 1)[-1] == str(inode):
            return True
    return False


def redis_url(broker_url: str) -> str | None:
    """A URL redis-py opens for a Celery broker URL (``redis+socket://PATH`` → ``unix://PATH``);
    ``None`` for a broker that is not Redis."""
    if broker_url.startswith(("redis://", "rediss://", "unix://")):
        return broker_url
    if broker_url.startswith("redis+socket://"):
        return "unix://" + broker_url.removeprefix("redis+socket://")
    return None


def check_agent(
    *, state_dir: str, broker_url: str, locks_path: str = "/proc/locks", timeout_s: float = TIMEOUT_S
) -> str:
    """Check that an agent holds ``state_dir``'s device lock and that its Redis broker answers.

    Returns:
        One line describing what was checked.

    Raises:
        Unhealthy: the variable is unset, the lock is not held, or the broker does not answer.
    """
    if not state_dir:
        raise Unhealthy("MTFL_AGENT_STATE_DIR is not set: the check cannot find the agent's lock")
    lock = Path(state_dir) / "agent.lock"
    try:
        held = lock_is_held(lock, Path(locks_path).read_text())
    except FileNotFoundError:
        raise Unhealthy(f"no agent has started here yet ({lock} does not exist)") from None
    if not held:
        raise Unhealthy(f"no agent holds {lock}: the agent process is not running")
    url = redis_url(broker_url)
    if url is None:
        raise Unhealthy(f"CELERY_BROKER_URL={broker_url.split('://')[0]}://… is not a Redis broker")
    import redis  # deferred: the Redis client, only when the broker is checked

    try:
        redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s).ping()
    except redis.RedisError as exc:
        raise Unhealthy(f"the broker does not answer PING: {type(exc).__name__}: {exc}") from None
    return f"agent holds {lock}; broker answers"


def check_worker(node: str, *, timeout_s: float = TIMEOUT_S) -> str:
    """Check that the Celery worker ``node`` answers a control ``ping`` through the broker at
    ``CELERY_BROKER_URL`` (read by Celery itself, which prefers that variable to any URL an app is
    given, so the check takes no other).

    Returns:
        One line naming the worker that answered.

    Raises:
        Unhealthy: the variable is unset, the broker does not answer, or the worker does not
            reply within ``timeout_s``.
    """
    if not os.environ.get("CELERY_BROKER_URL", "").strip():
        raise Unhealthy("CELERY_BROKER_URL is not set")
    from celery import Celery  # deferred: only this check needs Celery

    app = Celery("mtfl-healthcheck", set_as_current=False)
    try:
        replies = app.control.ping(destination=[node], timeout=timeout_s) or []
    except Exception as exc:  # noqa: BLE001 - kombu's connection errors vary by transport
        raise Unhealthy(f"the broker does not answer: {type(exc).__name__}: {exc}") from None
    finally:
        app.close()
    if not any(node in reply for reply in replies):
        raise Unhealthy(f"{node} did not answer a ping within {timeout_s:.0f} s")
    return f"{node} answers"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one check; return 0 (healthy) or 1 (one line on stderr)."""
    parser = argparse.ArgumentParser(
        prog="python -m controlplane.core.healthcheck", description="Container healthchecks for docker-compose.yml."
    )
    sub = parser.add_subparsers(dest="service", required=True)
    web = sub.add_parser("web", help="GET the web app's /healthz")
    web.add_argument("url", nargs="?", default="http://127.0.0.1:8000/healthz")
    worker = sub.add_parser("worker", help="a Celery worker answers a control ping")
    worker.add_argument("node", help="the worker's node name, e.g. control@$HOSTNAME")
    sub.add_parser("agent", help="the device agent holds its lock and the broker answers")
    args = parser.parse_args(argv)
    try:
        if args.service == "web":
            check_web(args.url, allowed_hosts=os.environ.get("ALLOWED_HOSTS", ""))
        elif args.service == "worker":
            check_worker(args.node)
        else:
            check_agent(
                state_dir=os.environ.get("MTFL_AGENT_STATE_DIR", "").strip(),
                broker_url=os.environ.get("CELERY_BROKER_URL", "").strip(),
            )
    except Unhealthy as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
