"""A checkpoint folder in an object store (``s3://``, ``gs://``, anything fsspec reaches).

Object stores have no rename, so nothing counts by being renamed into place. What makes a
checkpoint count is the order of the writes, each a single PUT, which a store makes visible
whole or not at all:

1. every rank writes its part under a prefix of the step's own (``step-000000040/``; torch's
   ``FsspecWriter``: each file one object, a part cut short by a killed rank never becomes an
   object);
2. rank 0 writes ``progress.json`` in that prefix, once every rank has written (torch's save
   returns on every rank only then);
3. rank 0 replaces ``latest.json`` (one PUT): the checkpoint counts from that moment; a crash
   before it leaves the previous checkpoint in force, and the next start removes the prefixes
   newer than the one in force.

S3 (since December 2020), Google Cloud Storage and Azure Blob read what was written last
(strong read-after-write consistency), so every rank sees the pointer rank 0 wrote.

There is no owner, mode or link to check: who may write the bucket is the trust boundary (a
``.metadata`` pickle planted there runs as the job), so keep checkpoints where only the job's
identity can write. There is no lock either (a dead run could not release it): one run per
prefix is the job's to ensure; ``job=`` still refuses another run's pointer.

Credentials come from the usual places (``AWS_*`` variables, ``AWS_ENDPOINT_URL``, the
provider's files), ``storage_options`` or the URL itself (``s3://KEY:SECRET@bucket/run``); they
never appear in a message: every text unidist shows about the folder passes through
:func:`redact`, told every secret of the three (:func:`secrets_of`).

Every operation unidist itself makes on the store (looking for, reading and writing its records,
listing and removing prefixes) has a deadline (the state's ``timeout``): an endpoint that accepts
connections and never answers costs that long, then a :class:`~unidist.errors.CheckpointError`
that says so. For an asynchronous driver (s3fs, gcsfs, adlfs) the request is cancelled on its
event loop; a synchronous one is left to finish in a thread of its own. torch's checkpoint
reader and writer (the tensors themselves) go through the driver with its own timeouts
(``storage_options``, e.g. s3fs's ``config_kwargs={"read_timeout": ...}``); a write that stands
still there is no progress, which ``unidist launch --hang-timeout`` names.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from unidist.errors import CheckpointError

_SENSITIVE_QUERY = re.compile(r"(?i)(signature|credential|token|sig|secret|key|password)")


class Url(str):
    """A URL that joins like a path (``url / "step-000000040"``)."""

    __slots__ = ()

    def __truediv__(self, name: str) -> Url:
        return Url(self.rstrip("/") + "/" + name)

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> Url:
        return Url(self.rstrip("/").rsplit("/", 1)[0])


def is_url(folder: object) -> bool:
    """Whether ``folder`` names an object store (a scheme other than ``file``)."""
    if not isinstance(folder, str) or "://" not in folder:
        return False
    return folder.split("://", 1)[0].lower() not in ("", "file")


def redact(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` without credentials: a URL's password and signed query, and ``secrets``."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")

    def clean(match: re.Match[str]) -> str:
        try:
            parts = urlsplit(match.group(0))
        except ValueError:
            return match.group(0)
        netloc = parts.netloc
        if "@" in netloc:
            user, _, host = netloc.rpartition("@")
            netloc = f"{user.split(':', 1)[0]}:***@{host}" if ":" in user else netloc
        query = "&".join(
            f"{k}=***" if _SENSITIVE_QUERY.search(k) else f"{k}={v}"
            for k, _, v in (item.partition("=") for item in parts.query.split("&") if item)
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))

    return re.sub(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+", clean, text)


def secrets_of(options: Mapping[str, Any], url: str = "") -> tuple[str, ...]:
    """The values in ``options``, in ``url``'s user part (a password, or a user alone: a
    token) and in the environment that must never be shown."""
    from unidist.environments import variables as _env

    found = [str(v) for k, v in options.items() if _SENSITIVE_QUERY.search(k) and v]
    found += _userinfo_secrets(url)
    found += _env.storage_secrets()
    return tuple(found)


def _userinfo_secrets(url: str) -> list[str]:
    """The secret of ``scheme://USER:SECRET@host/...`` (or ``scheme://TOKEN@host/...``), as
    written and decoded. Read up to the last ``@``, not by ``urlsplit``: an S3 secret key often
    holds ``/``, which ends ``urlsplit``'s host part early and hides the secret from it."""
    if "://" not in url:
        return []
    rest = url.split("://", 1)[1]
    userinfo = rest[: rest.rfind("@")] if "@" in rest else ""
    if not userinfo:
        return []
    secret = userinfo.split(":", 1)[1] if ":" in userinfo else userinfo
    # A driver that splits the URL at a "/" of the secret quotes the parts on either side.
    parts = [secret, unquote(secret), *secret.split("/"), *unquote(secret).split("/")]
    return [value for value in dict.fromkeys(parts) if value]


class _NoAnswer(Exception):
    """An operation on the store passed its deadline."""


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()`` in a thread of its own, awaited at most ``seconds`` (:class:`_NoAnswer`)."""
    result: list[Any] = []
    failure: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # handed to the caller
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="unidist-store-call", daemon=True).start()
    if not done.wait(seconds):
        raise _NoAnswer(f"no answer within {seconds:g} s")
    if failure:
        raise failure[0]
    return result[0]


class Remote:
    """A prefix of an object store, with the operations the checkpoint folder needs."""

    def __init__(
        self,
        fs: Any,
        path: str,
        url: Url,
        options: Mapping[str, Any],
        secrets: tuple[str, ...] = (),
        timeout: float | None = None,
    ) -> None:
        self.fs = fs
        self.bucket_path = path.rstrip("/")
        self.path = url
        self.options = dict(options)
        self.timeout = timeout  # seconds each operation may take (None: the driver's own)
        self._secrets = secrets or secrets_of(options)

    @classmethod
    def open_root(
        cls, url: str, options: Mapping[str, Any], timeout: float | None = None
    ) -> Remote:
        try:
            from fsspec.core import url_to_fs  # type: ignore[import-untyped]
        except ImportError as exc:  # pragma: no cover - fsspec comes with torch
            raise CheckpointError(f"{url}: fsspec is needed for object stores") from exc
        secrets = secrets_of(options, url)
        shown = Url(redact(url, secrets))
        try:
            fs, path = url_to_fs(url, **options)
        except ImportError as exc:
            scheme = url.split("://", 1)[0]
            extra = {"s3": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}
            package = extra.get(scheme, f"the fsspec driver of {scheme}://")
            raise CheckpointError(
                f"the checkpoint folder {shown} is in an object store whose driver is not "
                f"installed ({exc}). HINT: pip install {package} (for S3: pip install "
                "'pytorch-unidist[s3]')."
            ) from None
        except Exception as exc:
            raise CheckpointError(
                f"the checkpoint folder {shown} cannot be reached: "
                f"{redact(repr(exc), secrets)[:400]}"
            ) from None
        return cls(fs, path, shown, options, secrets, timeout)

    def _full(self, name: str) -> str:
        return f"{self.bucket_path}/{name}"

    def _error(self, what: str, exc: BaseException) -> CheckpointError:
        return CheckpointError(
            f"{what} in {self.path} failed: {redact(repr(exc), self._secrets)[:400]}"
        )

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """``fs.<method>(*args, **kwargs)`` within :attr:`timeout`; FileNotFoundError passes,
        any other failure is a CheckpointError about ``what``."""
        started = time.monotonic()
        try:
            if self.timeout is None:
                return getattr(self.fs, method)(*args, **kwargs)
            if getattr(self.fs, "async_impl", False) and getattr(self.fs, "loop", None):
                from fsspec.asyn import FSTimeoutError, sync  # type: ignore[import-untyped]

                # The request is cancelled on the driver's loop once the deadline passes.
                coroutine = getattr(self.fs, f"_{method}")
                try:
                    return sync(self.fs.loop, coroutine, *args, timeout=self.timeout, **kwargs)
                except FSTimeoutError as exc:  # the deadline's, or the driver's own timeout
                    if time.monotonic() - started >= 0.9 * self.timeout:
                        raise _NoAnswer() from None
                    raise self._error(what, exc) from None
            return _within(self.timeout, lambda: getattr(self.fs, method)(*args, **kwargs))
        except (FileNotFoundError, CheckpointError):
            raise
        except _NoAnswer:
            raise CheckpointError(
                f"{what} in {self.path}: the object store did not answer within "
                f"{self.timeout:g} s. HINT: check that its endpoint (AWS_ENDPOINT_URL, "
                "storage_options) is the store's and reachable, or give ResumableState a "
                "longer timeout= if the store is merely slow."
            ) from None
        except Exception as exc:
            raise self._error(what, exc) from None

    # -- the folder's operations (as handle.Dir's) --------------------------------------------

    @property
    def key(self) -> tuple[str, str]:
        return ("remote", self.bucket_path)

    def exists(self, name: str) -> bool:
        return bool(self._call(f"looking for {name}", "exists", self._full(name)))

    def read(self, name: str, *, limit: int, what: str) -> bytes:
        where = self.path / name
        try:
            size = self._call(f"reading the {what} {name}", "size", self._full(name))
        except FileNotFoundError:
            raise CheckpointError(f"the {what} {where} is missing.") from None
        if size is not None and size > limit:
            raise CheckpointError(
                f"the {what} {where} holds {size} bytes, more than the {limit} of any file "
                "unidist writes: it is not unidist's. HINT: remove it."
            )
        try:
            data: bytes = self._call(
                f"reading the {what} {name}", "cat_file", self._full(name), start=0, end=limit + 1
            )
        except FileNotFoundError:
            raise CheckpointError(f"the {what} {where} is missing.") from None
        if len(data) > limit:
            raise CheckpointError(f"the {what} {where} grew past {limit} bytes while being read.")
        return data

    def write(self, name: str, data: bytes) -> None:
        """One PUT: the object is replaced whole, or not at all."""
        try:
            self._call(f"writing {name}", "pipe_file", self._full(name), data)
        except FileNotFoundError as exc:
            raise self._error(f"writing {name}", exc) from None

    def entries(self) -> list[str]:
        try:
            found = self._call("listing", "ls", self.bucket_path, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return sorted({str(p).rstrip("/").rsplit("/", 1)[-1] for p in found})

    def open_dir(self, name: str, *, create: bool = False) -> Remote:
        """The prefix ``name`` inside this one (``create`` changes nothing: prefixes need no
        making)."""
        return Remote(
            self.fs, self._full(name), self.path / name, self.options, self._secrets, self.timeout
        )

    def check_tree(self) -> None:
        """Nothing to check: an object store has no owners, modes or links (see the module)."""

    def seal(self) -> None:
        """Nothing to do: access is the bucket's policy."""

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._call(f"removing {name}", "rm", self._full(name), recursive=True)

    def writer(self) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        return FsspecWriter(self._url(), **self.options)

    def reader(self) -> Any:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        return FsspecReader(self._url(), **self.options)

    def _url(self) -> str:
        protocol = self.fs.protocol
        scheme = protocol[0] if isinstance(protocol, tuple | list) else protocol
        return f"{scheme}://{self.bucket_path}"

    def dup(self) -> Remote:
        return Remote(
            self.fs, self.bucket_path, self.path, self.options, self._secrets, self.timeout
        )

    def close(self) -> None:
        """Nothing held open."""

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.close()
