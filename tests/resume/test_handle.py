"""The checkpoint folder is trusted by its handle: checked where it was opened, read through it.

Another local user must never get a pickle of theirs loaded: not by owning or being able to
write a folder above the checkpoint (refused, as ssh's StrictModes refuses such a home), and not
by swapping the folder between unidist's checks and torch's reads (nothing is read by path after
the folder was opened). The race is played for real: uid 65534, through ``setpriv``, swaps
folders with ``renameat2(RENAME_EXCHANGE)`` as fast as it can while the job restores.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import unidist
from tests._users import NOBODY, as_user, reachable_folder
from unidist.errors import CheckpointError
from unidist.resume import _folder as files
from unidist.resume._handle import Dir


class _Planted:
    """A pickle that, when loaded, writes the file it names (what an attacker would run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"import pathlib; pathlib.Path({str(self.marker)!r}).write_text('ran')",))


def _save(folder: Path, value: float) -> None:
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(value)
    state = unidist.ResumableState(folder, job="j", model=model, stop_signals=())
    state.save()
    state.close()


def _restored(folder: Path) -> float:
    model = nn.Linear(2, 1)
    state = unidist.ResumableState(folder, job="j", model=model, stop_signals=())
    try:
        assert state.restore()
    finally:
        state.close()
    return float(model.weight[0, 0].detach())


def _plant(checkpoint: Path, marker: Path) -> None:
    """Make ``checkpoint`` (a real one) run code when torch reads its metadata."""
    step = checkpoint / files.step_name(0)
    (step / ".metadata").write_bytes(pickle.dumps(_Planted(marker)))


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder that uid 65534 can reach (pytest's own are private to root)."""
    with reachable_folder("unidist-trust-") as path:
        yield path


# -- without another user: the handle itself ---------------------------------------------------


def test_a_folder_swapped_between_the_check_and_the_load_is_never_read(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both folders pass every check (this user's, private): only the handle tells them apart.
    # The swap comes at the worst moment, after the folder was opened and its pointer read,
    # before torch reads the metadata. Through the path, the planted pickle would run.
    genuine, other, marker = base / "ckpt", base / "other", base / "ran"
    _save(genuine, 1.0)
    _save(other, 2.0)
    _plant(other, marker)
    latest = files.latest

    def swap_then_read(root: Dir, job: str) -> int:
        found = latest(root, job)
        os.rename(genuine, base / "tmp")
        os.rename(other, genuine)
        return found

    monkeypatch.setattr(files, "latest", swap_then_read)
    assert _restored(genuine) == 1.0  # the folder that was checked, not what the path names now
    assert not marker.exists()
    monkeypatch.undo()
    with pytest.raises(CheckpointError, match=r"cannot be read|does not fit"):
        _restored(genuine)  # now the planted one, opened and checked: its pickle is refused...
    assert marker.exists()  # ...after running: it is this user's own file, so it is trusted


def test_a_folder_above_that_others_can_write_is_refused(base: Path) -> None:
    shared = base / "shared"
    shared.mkdir()
    _save(shared / "ckpt", 1.0)
    shared.chmod(0o777)
    with pytest.raises(CheckpointError, match=r"shared, a folder above .* writable by everyone"):
        _restored(shared / "ckpt")
    shared.chmod(0o775)
    with pytest.raises(CheckpointError, match=r"writable by its group \(mode 0775\)"):
        _restored(shared / "ckpt")
    shared.chmod(0o1777)  # the sticky bit, as /tmp: others cannot rename what is not theirs
    assert _restored(shared / "ckpt") == 1.0


def test_a_new_folder_is_made_private_and_so_are_the_folders_made_above_it(base: Path) -> None:
    old = os.umask(0o002)  # a umask that would leave new folders group-writable
    try:
        _save(base / "a" / "b" / "ckpt", 1.0)
    finally:
        os.umask(old)
    assert (base / "a").stat().st_mode & 0o777 == 0o755
    assert (base / "a" / "b" / "ckpt").stat().st_mode & 0o777 == 0o700
    assert _restored(base / "a" / "b" / "ckpt") == 1.0


def test_a_link_in_the_path_is_followed_once_and_what_it_leads_to_is_checked(base: Path) -> None:
    real = base / "real"
    real.mkdir()
    _save(real / "ckpt", 1.0)
    (base / "link").symlink_to(real)
    assert _restored(base / "link" / "ckpt") == 1.0
    real.chmod(0o777)  # what the link leads to is what counts
    with pytest.raises(CheckpointError, match=r"real, a folder above"):
        _restored(base / "link" / "ckpt")


def test_files_that_are_special_linked_or_shared_are_refused(base: Path) -> None:
    _save(base / "ckpt", 1.0)
    step = base / "ckpt" / files.step_name(0)
    os.link(step / ".metadata", base / "second-door")
    with pytest.raises(CheckpointError, match="has 2 links"):
        _restored(base / "ckpt")
    (base / "second-door").unlink()
    (step / "extra.fifo").unlink(missing_ok=True)
    os.mkfifo(step / "extra.fifo", 0o600)
    with pytest.raises(CheckpointError, match="special file"):
        _restored(base / "ckpt")


# -- another user, for real ---------------------------------------------------------------------

_ATTACKER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b, stop = sys.argv[1].encode(), sys.argv[2].encode(), sys.argv[3]
tries = swaps = 0
said = set()
while not os.path.exists(stop):
    tries += 1
    done = libc.renameat2(-100, a, -100, b, 2) == 0  # AT_FDCWD, RENAME_EXCHANGE
    swaps += done
    word = "swapped" if done else "refused"
    if word not in said:  # the first of each, so that the test knows the race is on
        said.add(word)
        print(word, flush=True)
print(tries, swaps, flush=True)
"""


def _race(first: Path, second: Path, stop: Path, expect: str) -> subprocess.Popen[str]:
    """The other user swapping ``first`` and ``second`` until ``stop`` exists; returns once
    it has ``expect``-ed (swapped, or been refused) at least once."""
    racer = subprocess.Popen(
        [
            *as_user(NOBODY),
            sys.executable,
            "-c",
            _ATTACKER,
            str(first),
            str(second),
            str(stop),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert racer.stdout is not None
    for line in racer.stdout:
        if line.strip() == expect:
            return racer
    racer.wait(timeout=30)
    raise AssertionError(f"the attacker never {expect} (exit code {racer.returncode})")


def _planted_copy(source: Path, where: Path, marker: Path, inside: str = "") -> None:
    """A copy of ``source`` at ``where``, owned by the other user, whose checkpoint (at
    ``where/inside``) runs code when read."""
    shutil.copytree(source, where)
    _plant(where / inside, marker)
    for path in [where, *where.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


@pytest.mark.otheruser
@pytest.mark.parametrize("swapped", ["the folder", "its parent"])
def test_another_user_racing_rename_exchange_never_gets_a_pickle_loaded(
    base: Path, swapped: str
) -> None:
    # The checkpoint lives under a folder everyone can write to (no sticky bit): the attacker
    # swaps either the checkpoint folder itself or the folder above it with one of its own,
    # 20 restores long. Before: the planted pickle ran after 0.5-1.4 s. Now every restore is
    # refused for the writable folder above, and nothing planted is ever read.
    open_to_all = base / "open"
    open_to_all.mkdir()
    parent = open_to_all / "runs" if swapped == "its parent" else open_to_all
    parent.mkdir(exist_ok=True)
    victim = parent / "ckpt"
    _save(victim, 1.0)
    target = parent if swapped == "its parent" else victim
    marker = base / "ran"
    decoy = target.with_name("decoy")
    _planted_copy(target, decoy, marker, "ckpt" if swapped == "its parent" else "")
    open_to_all.chmod(0o777)
    stop = base / "stop"
    racer = _race(target, decoy, stop, "swapped")
    try:
        for _ in range(20):
            with pytest.raises(CheckpointError, match="without the sticky bit"):
                _restored(victim)
    finally:
        stop.touch()
        out, _ = racer.communicate(timeout=30)
    _, swaps = (int(n) for n in out.split()[-2:])
    assert swaps > 0, "the attacker never managed a swap: the race was not played"
    assert not marker.exists()


@pytest.mark.otheruser
def test_with_the_sticky_bit_the_other_user_cannot_swap_and_the_job_resumes(base: Path) -> None:
    shared = base / "shared"
    shared.mkdir()
    victim = shared / "ckpt"
    _save(victim, 1.0)
    marker = base / "ran"
    _planted_copy(victim, shared / "decoy", marker)
    shared.chmod(0o1777)
    stop = base / "stop"
    racer = _race(victim, shared / "decoy", stop, "refused")
    try:
        for _ in range(20):
            assert _restored(victim) == 1.0
    finally:
        stop.touch()
        out, _ = racer.communicate(timeout=30)
    tries, swaps = (int(n) for n in out.split()[-2:])
    assert (tries > 0, swaps) == (True, 0)  # EPERM every time: the sticky bit holds
    assert not marker.exists()


@pytest.mark.otheruser
def test_a_folder_above_owned_by_another_user_is_refused(base: Path) -> None:
    theirs = base / "theirs"
    theirs.mkdir(mode=0o755)
    _save(theirs / "ckpt", 1.0)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(CheckpointError, match=f"belongs to user id {NOBODY}: that user can rename"):
        _restored(theirs / "ckpt")
