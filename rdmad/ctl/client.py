"""The daemon's API over its UNIX socket: one HTTP/1.1 request per connection, JSON
answers, server-sent events, and every way that can fail as a ``CtlError``.

HTTP is spoken here rather than through ``http.client`` on purpose: importing it
pulls in ``email.parser`` and ``ssl``, about 20 ms of rdmad-ctl's 40 ms start-up
budget (``python3 -X importtime``). The API needs a small fixed subset: one request
per connection (``Connection: close``), bodies framed by Content-Length, chunked
transfer coding (aiohttp's event stream) or the end of the connection.
"""

from __future__ import annotations

import errno
import json
import socket
import struct

from rdmad import __version__, exits

TYPE_CHECKING = False  # typing costs 4 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any, BinaryIO

DEFAULT_SOCKET = "/run/rdmad/rdmad.sock"
MAX_BODY = 64 * 1024 * 1024  # a status of thousands of VFs is a few MiB; more is a bug
MAX_HEADER_LINE = 64 * 1024
START_HINT = "start it: systemctl start rdmad; why it stopped: journalctl -u rdmad"
GROUP_HINT = (
    "reads need root or the API's read group (default `rdmad`, [api] read_group); "
    "reload and reconcile need root or [api] write_group"
)


class CtlError(Exception):
    """A request that did not give an answer to show; ``exit_code`` says how it failed."""

    exit_code = exits.FAIL


class NotRunning(CtlError):
    exit_code = exits.NOT_RUNNING


class Denied(CtlError):
    exit_code = exits.DENIED


class RequestFailed(CtlError):
    exit_code = exits.FAIL


class Unavailable(RequestFailed):
    """503: rdmad is up but cannot answer this now (it is stopping, or busy with it)."""


class ConnectionLost(RequestFailed):
    """The connection ended before a whole answer: rdmad stopped or died meanwhile."""


class NoAnswer(CtlError):
    """rdmad took the connection but gave no answer in time: stuck, not just unhappy."""

    exit_code = exits.NO_ANSWER


class Response:
    """Status, headers (lower-case names) and a reader positioned at the body."""

    def __init__(self, status: int, headers: dict[str, str], reader: BinaryIO) -> None:
        self.status = status
        self.headers = headers
        self._reader = reader

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    def read(self) -> bytes:
        """The whole body, de-chunked."""
        if self.chunked:
            return b"".join(self.chunks())
        length = self.headers.get("content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                raise RequestFailed(f"bad Content-Length from rdmad: {length!r}") from None
            if size > MAX_BODY:
                raise RequestFailed(f"rdmad's answer is too large ({size} bytes)")
            body = self._reader.read(size)
            if len(body) < size:
                raise ConnectionLost("rdmad closed the connection in the middle of its answer")
            return body
        body = self._reader.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            raise RequestFailed("rdmad's answer is too large")
        return body

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives: chunk by chunk, or line by line when not chunked."""
        if not self.chunked:
            while line := self._reader.readline(MAX_HEADER_LINE):
                yield line
            return
        while True:
            size_line = self._reader.readline(MAX_HEADER_LINE)
            if not size_line:
                raise ConnectionLost("rdmad closed the connection in the middle of its answer")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise RequestFailed(f"bad chunk from rdmad: {size_line[:40]!r}") from None
            if size == 0:
                return
            data = self._reader.read(size)
            if len(data) < size or self._reader.readline(MAX_HEADER_LINE) != b"\r\n":
                raise ConnectionLost("rdmad closed the connection in the middle of its answer")
            yield data


class Client:
    """Requests to one socket; every failure is a ``CtlError`` with words for an operator."""

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout

    def get(self, target: str, query: dict[str, object] | None = None, wait: float = 0.0) -> Any:
        """GET; ``wait``: how long the server may hold the answer beyond the usual
        timeout (``/v1/status?wait=``: until converged)."""
        return self._json("GET", target, query, self.timeout + wait)

    def post(
        self,
        target: str,
        query: dict[str, object] | None = None,
        wait: float = 0.0,
        body: dict[str, object] | None = None,
        method: str = "POST",
    ) -> Any:
        """POST (or ``method``) with ``body`` as JSON, or empty; ``wait`` is how long the
        server may take beyond the usual timeout (reload/reconcile wait for their pass)."""
        data = json.dumps(body).encode() if body is not None else b""
        return self._json(method, target, query, self.timeout + wait, data)

    def events(self, idle_timeout: float) -> Iterator[tuple[str, str]]:
        """(event, data) of ``/v1/events`` until the server closes the stream.

        ``idle_timeout``: the server sends a keepalive every 15 s, so silence this
        long means it is stuck.
        """
        sock, resp = self._open("GET", "/v1/events", None, self.timeout, "text/event-stream")
        try:
            if resp.status != 200:
                _raise_for(resp.status, _safe_read(resp), "/v1/events")
            sock.settimeout(idle_timeout)
            yield from _parse_sse(_lines(resp.chunks()), idle_timeout)
        finally:
            sock.close()

    def _json(
        self,
        method: str,
        target: str,
        query: dict[str, object] | None,
        timeout: float,
        body: bytes = b"",
    ) -> Any:
        sock, resp = self._open(method, target, query, timeout, "application/json", body)
        try:
            body = _read_body(resp, timeout)
        finally:
            sock.close()
        if resp.status != 200:
            _raise_for(resp.status, body, target)
        try:
            return json.loads(body)
        except ValueError:
            raise RequestFailed(
                f"rdmad's answer to {target} is not JSON: {_excerpt(body)}"
            ) from None

    def _open(
        self,
        method: str,
        target: str,
        query: dict[str, object] | None,
        timeout: float,
        accept: str,
        body: bytes = b"",
    ) -> tuple[socket.socket, Response]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._connect(sock, timeout)
            sock.settimeout(timeout)
            url = target + _query_string(query)
            request = (
                f"{method} {url} HTTP/1.1\r\nHost: rdmad\r\n"
                f"User-Agent: rdmad-ctl/{__version__}\r\nAccept: {accept}\r\n"
                f"Connection: close\r\nContent-Length: {len(body)}\r\n"
                + ("Content-Type: application/json\r\n" if body else "")
                + "\r\n"
            )
            try:
                sock.sendall(request.encode() + body)
                reader = sock.makefile("rb")
                resp = _read_head(reader)
            except TimeoutError:
                raise NoAnswer(f"rdmad did not answer {target} within {timeout:g} s") from None
            except OSError as exc:
                raise _failed(exc) from None
        except BaseException:
            sock.close()
            raise
        return sock, resp

    def _connect(self, sock: socket.socket, timeout: float) -> None:
        """Connect, waiting up to ``timeout`` for room in a full listen backlog.

        A connect to an AF_UNIX socket whose backlog is full (other local users' connections
        that rdmad has not yet accepted, as in a flood) fails at once with EAGAIN on a
        non-blocking socket, which Python's ``settimeout`` makes it. A blocking one waits
        in the kernel for up to SO_SNDTIMEO and is woken by rdmad's next accept, so root's
        request takes the first free place instead of failing or polling for one.
        """
        seconds = max(timeout, 0.001)
        whole = int(seconds)
        sock.setsockopt(
            socket.SOL_SOCKET,
            socket.SO_SNDTIMEO,
            struct.pack("@ll", whole, int((seconds - whole) * 1_000_000)),
        )
        try:
            sock.connect(self.path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            why = "no socket" if isinstance(exc, FileNotFoundError) else "nothing listens"
            raise NotRunning(f"rdmad is not running ({why} at {self.path})") from None
        except PermissionError:
            raise Denied(f"permission denied on {self.path}: {GROUP_HINT}") from None
        except (BlockingIOError, TimeoutError):
            raise NoAnswer(
                f"rdmad did not accept a connection on {self.path} within {timeout:g} s "
                "(its backlog of waiting connections stayed full)"
            ) from None
        except OSError as exc:
            raise RequestFailed(f"cannot connect to {self.path}: {_strerror(exc)}") from None
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("@ll", 0, 0))


def _read_body(resp: Response, timeout: float) -> bytes:
    try:
        return resp.read()
    except TimeoutError:
        raise NoAnswer(f"rdmad did not finish its answer within {timeout:g} s") from None
    except OSError as exc:
        raise _failed(exc) from None


def _failed(exc: OSError) -> RequestFailed:
    """A connection that failed mid-request: reset or broken by the other end is rdmad
    gone (``ConnectionLost``), anything else a failure of its own."""
    message = f"the connection to rdmad failed: {_strerror(exc)}"
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return ConnectionLost(message)
    return RequestFailed(message)


def _safe_read(resp: Response) -> bytes:
    try:
        return resp.read()
    except (CtlError, OSError):
        return b""


def _read_head(reader: BinaryIO) -> Response:
    status_line = reader.readline(MAX_HEADER_LINE)
    if not status_line:
        raise ConnectionLost("rdmad closed the connection without answering")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise RequestFailed(f"rdmad's answer is not HTTP: {_excerpt(status_line)}")
    headers: dict[str, str] = {}
    while True:
        line = reader.readline(MAX_HEADER_LINE)
        if line in (b"\r\n", b"\n"):
            break
        if not line:
            raise RequestFailed("rdmad closed the connection in the middle of its answer")
        name, sep, value = line.decode("latin-1").partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return Response(int(parts[1]), headers, reader)


def _raise_for(status: int, body: bytes, target: str) -> None:
    """An error answer as the exception that says what happened, in the API's own words
    when it sent its JSON error (docs/API.md), else with an excerpt of what it sent."""
    code, message = "", _excerpt(body)
    try:
        err = json.loads(body)["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        pass
    label = f"{status} {code}".strip()
    if status == 403:
        raise Denied(f"rdmad refused {target} ({label}): {message}; {GROUP_HINT}")
    if status == 503:
        raise Unavailable(f"rdmad cannot answer {target} now ({label}): {message}")
    raise RequestFailed(f"rdmad answered {target} with {label}: {message}")


def _query_string(query: dict[str, object] | None) -> str:
    items = {k: v for k, v in (query or {}).items() if v is not None}
    if not items:
        return ""
    from urllib.parse import urlencode  # only history and the mutations have queries

    return "?" + urlencode(items)


def _lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Text lines (without their end) out of chunks that split lines anywhere."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", "replace")


def _parse_sse(lines: Iterator[str], idle_timeout: float) -> Iterator[tuple[str, str]]:
    """Server-sent events (the WHATWG rules rdmad uses: event, data, comments)."""
    event = ""
    data: list[str] = []
    try:
        for line in lines:
            if not line:
                if data:
                    yield event or "message", "\n".join(data)
                event, data = "", []
                continue
            if line.startswith(":"):
                continue  # a keepalive comment
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
    except TimeoutError:
        raise NoAnswer(
            f"no event or keepalive from rdmad in {idle_timeout:g} s: it seems stuck"
        ) from None
    except OSError as exc:
        raise RequestFailed(f"the event stream failed: {_strerror(exc)}") from None


def _strerror(exc: OSError) -> str:
    if exc.errno is not None and exc.errno in errno.errorcode:
        return f"{exc.strerror} ({errno.errorcode[exc.errno]})"
    return str(exc) or type(exc).__name__


def _excerpt(data: bytes, limit: int = 200) -> str:
    text = data.decode("utf-8", "replace").strip()
    if not text:
        return "(empty)"
    return text if len(text) <= limit else text[:limit] + "..."
