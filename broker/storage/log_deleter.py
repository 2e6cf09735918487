"""Background removal of log directories moved aside for deletion (Kafka's "kafka-delete-logs").

A log leaves service by a rename first (``LogManager.delete``): its directory
becomes ``<topic>-<partition>.<32 hex digits>-delete`` (a random UUID, as
Kafka names them), the data dir is fsynced, and only then are its files
removed, here, in one worker thread, so deleting GiBs never stalls the event
loop. A crash anywhere in between leaves a ``-delete`` directory, which
``LogManager.load`` never opens as a log and hands back to this deleter: the
deletion finishes at the next start-up.

Supervision: the worker catches every failure of one directory, logs it at
ERROR with the path, counts it (``failures``) and goes on; the directory stays
for the next start-up. Should the worker end any other way (a bug), the
``on_failure`` callback gets the exception (the broker stops on it) and later
``submit`` calls raise. The queue holds paths only and is bounded by the
directories on disk.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from tidewater.proto.errors import InvariantViolation

log = logging.getLogger(__name__)

DELETE_DIR_SUFFIX = "-delete"


class LogDirDeleter:
    def __init__(self, *, on_failure: Callable[[BaseException], None] | None = None,
                 remove: Callable[[Path], None] = shutil.rmtree):
        self._on_failure = on_failure
        self._remove = remove  # a test may inject a failure or a crash
        self._queue: deque[Path] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.failure: BaseException | None = None
        self.deleted = 0
        self.failures = 0

    def submit(self, path: Path) -> None:
        """Queue ``path`` (a ``-delete`` directory) for removal."""
        path = Path(path)
        if not path.name.endswith(DELETE_DIR_SUFFIX):
            raise InvariantViolation(f"not a -delete directory: {path}")
        with self._cond:
            if self.failure is not None:
                raise RuntimeError("the log deleter died") from self.failure
            if self._closed:
                return  # shutting down: the next start-up finishes it
            self._queue.append(path)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="delete-logs", daemon=True)
                self._thread.start()
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + (1 if self._busy else 0)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every queued directory was handled; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy
                                       or self.failure is not None, timeout_s)

    def close(self) -> None:
        """Stop taking work; what is still queued stays on disk for the next start-up."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
                    self._cond.wait_for(lambda: self._queue or self._closed)
                    if self._closed:
                        return
                    path = self._queue.popleft()
                    self._busy = True
                self._delete(path)
        except BaseException as e:
            log.critical("the log deleter thread died", exc_info=e)
            try:
                if self._on_failure is not None:
                    self._on_failure(e)
            finally:
                with self._cond:
                    self.failure = e
                    self._busy = False
                    self._cond.notify_all()

    def _delete(self, path: Path) -> None:
        try:
            self._remove(path)
        except FileNotFoundError:
            pass  # removed already (a retry after a crash)
        except InvariantViolation:
            raise  # a bug: the thread dies and ``on_failure`` stops the broker
        except Exception as e:  # one directory must not stop the others
            self.failures += 1
            log.error("cannot delete %s (left for the next start-up): %s", path, e)
            return
        self.deleted += 1
        log.info("deleted %s", path)
