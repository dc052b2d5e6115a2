"""The docker engine side of the docker backend: the process-wide docker-py client, error classification, and a
reader of the multiplexed stream of an exec."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from typing import Any

_CLIENT = None
_CLIENT_LOCK = threading.Lock()


def docker_client():
    """The process-wide docker-py client (``docker.from_env``, so DOCKER_HOST/DOCKER_TLS_VERIFY apply)."""
    global _CLIENT
    with _CLIENT_LOCK:
        if _CLIENT is None:
            import docker

            _CLIENT = docker.from_env(timeout=120, max_pool_size=int(os.environ.get("AGENTRL_DOCKER_POOL", "256")))
        return _CLIENT


def docker_available() -> tuple[bool, str]:
    """(True, version) when an engine answers, else (False, reason)."""
    try:
        return True, docker_client().version().get("Version", "?")
    except Exception as e:  # any failure means "not usable here"
        return False, f"{type(e).__name__}: {e}"


def engine_answers(timeout_s: float = 5.0) -> bool:
    """Whether the engine at DOCKER_HOST answers a ping within ``timeout_s`` (a client of its own: the process-wide
    one waits up to 120 s on an engine that accepts and hangs)."""
    import docker

    try:
        client = docker.from_env(timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # any failure means "not answering"
        return False


def _is_transient(e: Exception) -> bool:
    import docker
    import requests

    if isinstance(e, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        return True
    if isinstance(e, docker.errors.APIError) and not isinstance(e, docker.errors.NotFound):
        code = getattr(e.response, "status_code", None) or 0
        return code >= 500 or code == 429
    return False


class _Stream:
    """Reader of docker's multiplexed exec stream (8-byte frame headers: stream id, 3 zero bytes, size BE32)."""

    def __init__(self, sock: Any):
        # unix/tcp: a SocketIO around a socket; other transports (ssh) give a file-like object
        self.sock = getattr(sock, "_sock", sock)
        self._recv = getattr(self.sock, "recv", None) or self.sock.read
        self.buf = bytearray()
        self.eof = False

    def ready(self) -> bool:
        """Whether anything (data or the end) has arrived, without waiting."""
        if self.buf or self.eof:
            return True
        if not hasattr(self.sock, "setblocking"):
            return False
        self.sock.setblocking(False)
        try:
            chunk = self._recv(65536)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return False
        finally:
            self.sock.setblocking(True)
        if not chunk:
            self.eof = True
        self.buf += chunk
        return True

    def read(self, until: float) -> None:
        """Reads what arrives before monotonic time ``until`` (at least one chunk unless the time is up); sets
        ``eof`` when the stream ended."""
        while not self.eof:
            left = until - time.monotonic()
            if left <= 0:
                return
            if hasattr(self.sock, "settimeout"):
                self.sock.settimeout(min(left, 5.0))
            try:
                chunk = self._recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                self.eof = True
                return
            self.buf += chunk
            return

    def frames(self):
        """The complete frames received so far."""
        while len(self.buf) >= 8:
            (size,) = struct.unpack(">I", bytes(self.buf[4:8]))
            if len(self.buf) < 8 + size:
                return
            stream_id = self.buf[0]
            data = bytes(self.buf[8 : 8 + size])
            del self.buf[: 8 + size]
            yield stream_id, data

    def close(self) -> None:
        # The socket docker-py hands out still has SocketIO references held by its HTTP response, so close()
        # only marks it closed and the fd stays open until garbage collection (a ResourceWarning per exec).
        # Detaching and closing the fd releases it now.
        sock = self.sock
        if isinstance(sock, socket.socket):
            try:
                if sock.fileno() != -1:
                    os.close(sock.detach())
            except OSError:
                pass
        else:
            try:
                sock.close()
            except OSError:
                pass
