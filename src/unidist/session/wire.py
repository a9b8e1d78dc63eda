"""What unidist writes to its control store, and how it reads it back without trusting the store.

Any process that can reach the store can connect to it (a ``TCPStore`` has no authentication),
and from torch 2.10 on it can also list the keys. So nothing read from the store is unpickled,
and nothing is believed that does not carry this job's seal:

* **Key names** are a keyed hash (BLAKE2b with the job's secret) of the logical name
  (``agree/<group>/arrivals/0``, ``agree/<group>/outcome/<call>``): another process can
  neither predict a key before it is written, so it cannot pre-seed one, nor learn the secret
  from the keys it lists.
* **Values** carry a MAC (BLAKE2b with the same secret) over the key name and the bytes, checked
  before anything is parsed; a value moved from another key, or forged, is rejected.
* **Payloads** are JSON with size limits, parsed only after the MAC has passed, and then checked
  for shape by their reader.

The secret is drawn by rank 0 (:func:`new_secret`) and travels to the other ranks over the
process group, never through the store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import struct
from collections.abc import Iterable
from typing import TypeAlias

from unidist.errors import ConfigurationError

__all__ = [
    "MAX_OUTCOME_BYTES",
    "MAX_RECORD_BYTES",
    "SECRET_BYTES",
    "Json",
    "Records",
    "Sealer",
    "decode_json",
    "encode_json",
    "new_secret",
]

#: A JSON value: what the control plane carries between ranks.
Json: TypeAlias = "bool | int | float | str | list[Json] | dict[str, Json] | None"

SECRET_BYTES = 32
#: Largest payload one rank may contribute to one agreement (a traceback fits many times).
MAX_RECORD_BYTES = 64 * 1024
#: Largest outcome an agreement may publish (it is read by every rank).
MAX_OUTCOME_BYTES = 1024 * 1024
_MAC_BYTES = 16
_NAME_BYTES = 12
_HEADER = struct.Struct(">IQI")  # rank, generation, payload length
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)  # C-accelerated, reused
_PREFIX = "unidist/"


def new_secret() -> bytes:
    """A fresh per-job secret (rank 0 draws it once per session)."""
    return secrets.token_bytes(SECRET_BYTES)


def encode_json(value: object, what: str, limit: int = MAX_RECORD_BYTES) -> bytes:
    """``value`` as compact JSON bytes, at most ``limit`` of them.

    Raises:
        ConfigurationError: the value is not plain JSON data, or too large.
    """
    try:
        data = _ENCODER.encode(value).encode()
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{what}: the value {value!r:.200} cannot travel through the control store: {exc}. "
            "HINT: send plain data (None, bools, numbers, strings, lists, dicts with string "
            "keys); the control store never pickles."
        ) from exc
    if len(data) > limit:
        raise ConfigurationError(
            f"{what}: the value takes {len(data)} bytes as JSON; the control store carries at "
            f"most {limit}. HINT: send a short summary (the control store is for decisions, "
            "not data; use all_gather_object for data)."
        )
    return data


def decode_json(data: bytes) -> Json:
    """JSON bytes back to a value (only ever called on bytes whose seal was checked)."""
    value: Json = json.loads(data)
    return value


class Records:
    """The records that the ranks appended to one key: ``rank -> payload``, and what was wrong."""

    def __init__(self) -> None:
        self.payloads: dict[int, bytes] = {}
        #: Problems found while reading (forged or garbled bytes, ranks that wrote twice).
        self.problems: list[str] = []


class Sealer:
    """Names keys and seals values with one job's secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError(f"the control secret has {len(secret)} bytes; at least 16 expected")
        self._secret = secret

    def name(self, logical: str) -> str:
        """The store key of ``logical``: unpredictable without the secret."""
        digest = hashlib.blake2b(logical.encode(), key=self._secret, digest_size=_NAME_BYTES)
        return _PREFIX + digest.hexdigest()

    def _mac(self, key: str, *parts: bytes) -> bytes:
        mac = hashlib.blake2b(key=self._secret, digest_size=_MAC_BYTES)
        mac.update(key.encode())
        mac.update(b"\0")
        for part in parts:
            mac.update(part)
        return mac.digest()

    def tags(
        self, key: str, generation: int, spec: bytes, ranks: Iterable[int], bits: int
    ) -> list[int]:
        """The arrival tags of ``ranks`` for one call: secret numbers of ``bits`` bits each.

        A rank that sent its expected value adds its tag to the count ``key`` (shifted above the
        arrival count): the tags of a call are unpredictable without the secret and differ for every
        generation, rank and set of expected values (``spec``), so a count that holds the sum of
        every member's tag proves that every member sent its expected value, and nothing another
        process can add to the count produces that sum except by guessing (one chance in
        ``2**bits``).
        """
        base = hashlib.blake2b(key=self._secret, digest_size=8)
        base.update(key.encode() + b"\0" + generation.to_bytes(8, "big"))
        base.update(hashlib.blake2b(spec, digest_size=16).digest())
        found = []
        for rank in ranks:
            one = base.copy()
            one.update(rank.to_bytes(4, "big"))
            found.append(int.from_bytes(one.digest(), "big") >> (64 - bits))
        return found

    # -- one value per key (outcomes) --------------------------------------------------------

    def seal(self, key: str, payload: bytes) -> bytes:
        """``payload`` with its MAC in front, to be stored under ``key``."""
        return self._mac(key, payload) + payload

    def open(self, key: str, data: bytes, limit: int = MAX_OUTCOME_BYTES) -> bytes | None:
        """The payload sealed under ``key``; None if the bytes are not this job's."""
        if not _MAC_BYTES <= len(data) <= _MAC_BYTES + limit:
            return None
        mac, payload = data[:_MAC_BYTES], data[_MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(key, payload)):
            return None
        return payload

    # -- many records appended to one key (arrivals) -----------------------------------------

    def record(self, key: str, rank: int, generation: int, payload: bytes) -> bytes:
        """One rank's record of one generation, to be appended to ``key``."""
        header = _HEADER.pack(rank, generation, len(payload))
        return header + payload + self._mac(key, header, payload)

    def read_records(self, key: str, data: bytes, generation: int, ranks: Iterable[int]) -> Records:
        """Split what was appended to ``key`` into the records of ``generation``.

        Reading stops at the first record whose length or seal is wrong: bytes after it cannot
        be framed reliably. A sealed record of another generation (replayed) is a problem too.
        """
        allowed = set(ranks)
        found = Records()
        most = len(allowed) * (_HEADER.size + MAX_RECORD_BYTES + _MAC_BYTES)
        if len(data) > most:  # not parsed: more than the ranks can have written
            found.problems.append(
                f"{len(data)} bytes of arrivals, more than {len(allowed)} ranks can write ({most})"
            )
            return found
        offset = 0
        while offset < len(data):
            problem = self._one_record(key, data, offset, (generation, allowed), found)
            if isinstance(problem, str):
                found.problems.append(problem)
                break
            offset = problem
        return found

    def _one_record(
        self,
        key: str,
        data: bytes,
        offset: int,
        expected: tuple[int, set[int]],
        found: Records,
    ) -> int | str:
        """Read the record at ``offset`` into ``found``; the next offset, or what is wrong."""
        end = offset + _HEADER.size
        if end > len(data):
            return f"{len(data) - offset} stray bytes at the end"
        header = data[offset:end]
        rank, generation, length = (int(field) for field in _HEADER.unpack(header))
        if length > MAX_RECORD_BYTES or end + length + _MAC_BYTES > len(data):
            return f"a record claims {length} bytes, which are not there"
        payload = data[end : end + length]
        mac = data[end + length : end + length + _MAC_BYTES]
        if not hmac.compare_digest(mac, self._mac(key, header, payload)):
            return "a record without this job's seal (written by another process?)"
        if generation != expected[0] or rank not in expected[1]:
            return f"a sealed record of rank {rank} and call {generation}, not of this call"
        if rank in found.payloads:
            return f"rank {rank} arrived twice"
        found.payloads[rank] = payload
        return end + length + _MAC_BYTES
