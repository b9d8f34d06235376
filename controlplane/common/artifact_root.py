"""The artifact root's layout and room, below every app: one folder per run
(``runs/<run id>``), the free space a round needs, byte counts for people.

The apps that write there (experiments: a run's start and its rounds) and the one that manages
what is kept (:mod:`controlplane.storage`) both read it, so neither imports the other for it.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from controlplane.conf import mtfl_setting
from workers.fl.artifacts import LocalArtifactStore, get_store

log = logging.getLogger(__name__)


def format_bytes(n: int | float) -> str:
    """``n`` bytes in binary units, ``"375.2 MiB"`` (``"512 B"`` under a KiB)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def local_store() -> LocalArtifactStore:
    """The control plane's artifact store (``ARTIFACT_ROOT``).

    Raises:
        TypeError: the store is not a local one (the factory only makes local stores today).
    """
    store = get_store()
    if not isinstance(store, LocalArtifactStore):
        raise TypeError(f"the storage lifecycle needs a local artifact store, not {store!r}")
    return store


def run_folder(run_id: int) -> str:
    """The key prefix of everything a run writes: ``runs/<run id>``."""
    return f"runs/{int(run_id)}"


def run_folders_remove(run_ids: Sequence[int]) -> None:
    """Remove the runs' artifact folders (after their rows are gone); a failure is logged, and
    :func:`controlplane.storage.services.retention.gc` removes what is left as orphans."""
    store = local_store()
    for run_id in run_ids:
        folder = store.path(run_folder(run_id))
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("could not remove %s of deleted run %s: %s", folder, run_id, exc)


def storage_space_problem() -> str | None:
    """A one-line message when ``ARTIFACT_ROOT`` has less free space than
    ``MTFL_MIN_FREE_BYTES``, else ``None``. A round refuses to start with this message: its
    devices' weights and its global models need room."""
    root = local_store().root
    return space_problem(root, shutil.disk_usage(root).free, int(mtfl_setting("MIN_FREE_BYTES")))


def space_problem(root: Path, free: int, threshold: int) -> str | None:
    """The message of :func:`storage_space_problem` for ``free`` bytes at ``root`` against
    ``threshold`` bytes, or ``None`` when there is enough."""
    if free >= threshold:
        return None
    return (
        f"ARTIFACT_ROOT {root} has {format_bytes(free)} free ({free} bytes), below MTFL_MIN_FREE_BYTES="
        f"{threshold} ({format_bytes(threshold)}): free space (`mtfl gc`, or delete runs) or lower the threshold"
    )
