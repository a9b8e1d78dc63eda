"""unidist's microbatch setting, translated to Composer's ``device_train_microbatch_size``.

Composer's ``Trainer`` does its own microbatching, so unidist does not wrap its loop; it translates
the same setting, and says clearly where Composer refuses it::

    from unidist.integrations.composer import composer_microbatch_size

    trainer = Trainer(..., device="gpu",
                      device_train_microbatch_size=composer_microbatch_size("auto", device="gpu"))

What Composer 0.32.1 does with ``"auto"`` (and unidist therefore checks or documents):

* only on a GPU device (``DeviceGPU``); on any other device it raises ``ValueError("Can only use
  adaptive device_train_microbatch_size on GPU. ...")`` — checked here, with a hint;
* it starts at the train dataloader's ``batch_size`` and halves on CUDA OOM, never grows, and
  raises at size 1 — a :class:`~unidist.SizePolicy` with other rules cannot be translated;
* it refuses FSDP2, tensor-parallel-only configs, a profiler and sequence parallelism; with DDP
  an OOM during backward on only some ranks can still deadlock (mosaicml/composer PR #2117).
  :class:`unidist.MicroBatcher` in your own loop (or Ignite) has none of these limits.
"""

from __future__ import annotations

from typing import Any, Literal

from unidist.errors import ConfigurationError
from unidist.microbatch import MicroBatcher, SizePolicy

__all__ = ["COMPOSER_REFUSAL", "composer_microbatch_size"]

#: The start of Composer 0.32.1's error for ``"auto"`` off GPU (tests keep this in sync).
COMPOSER_REFUSAL = "Can only use adaptive device_train_microbatch_size on GPU."

#: Device names Composer's ``get_device`` accepts.
_COMPOSER_DEVICES = ("cpu", "gpu", "mps", "tpu", "neuron", "hpu")


def composer_microbatch_size(
    setting: int | Literal["auto"] | MicroBatcher | SizePolicy | None = "auto",
    *,
    device: Any = None,
) -> int | Literal["auto"] | None:
    """The ``device_train_microbatch_size`` for Composer's ``Trainer`` that means ``setting``.

    Args:
        setting: ``"auto"`` (search on OOM), a fixed size, a :class:`~unidist.MicroBatcher`
            (its current size, e.g. one found by a probing run), a :class:`~unidist.SizePolicy`
            (its ``start``, or ``"auto"`` when it has none), or None (no microbatching).
        device: the ``device`` given to the Trainer: a name (``"gpu"``, ``"cpu"``, ...), a
            Composer ``Device``, or None (Composer's default: GPU when CUDA is available).

    Returns:
        An int, ``"auto"`` or None, to pass as ``device_train_microbatch_size``.

    Raises:
        ConfigurationError: ``"auto"`` on a device where Composer refuses it, a policy Composer
            cannot follow, or an invalid size.
    """
    if setting is None:
        return None
    if isinstance(setting, MicroBatcher):
        if setting.size is None:
            raise ConfigurationError(
                "the MicroBatcher has not run a step yet, so it has no size to give Composer. "
                "HINT: run a step first, or pass SizePolicy(start=...) or 'auto'."
            )
        return setting.size
    if isinstance(setting, SizePolicy):
        _check_translatable(setting)
        if setting.start is not None:
            return setting.start
        setting = "auto"
    if setting == "auto":
        _check_auto_device(device)
        return "auto"
    if isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1:
        return setting
    raise ConfigurationError(
        f"microbatch setting {setting!r} is not 'auto', a positive int, a MicroBatcher, a "
        "SizePolicy or None."
    )


def _check_translatable(policy: SizePolicy) -> None:
    custom = [
        name
        for name in ("shrink", "grow")
        if getattr(type(policy), name) is not getattr(SizePolicy, name)
    ]
    problems = []
    if custom:
        problems.append(f"a custom {' and '.join(custom)}()")
    if policy.grow_after is not None:
        problems.append(f"grow_after={policy.grow_after}")
    if policy.minimum != 1:
        problems.append(f"minimum={policy.minimum}")
    if problems:
        raise ConfigurationError(
            f"Composer's Trainer cannot follow this SizePolicy ({', '.join(problems)}): it only "
            "halves on OOM, never grows, and stops at 1. HINT: use the default SizePolicy with "
            "Composer, or unidist.MicroBatcher in your own loop for these rules."
        )


def _check_auto_device(device: Any) -> None:
    name = _device_name(device)
    if name == "gpu":
        return
    raise ConfigurationError(
        f"device_train_microbatch_size='auto' needs a GPU in Composer's Trainer, and the device "
        f'is {name!r}: Composer 0.32.1 refuses it with "{COMPOSER_REFUSAL} Please set '
        'device_train_microbatch_size >= 1." HINT: pass an int (for example the size a '
        "unidist.MicroBatcher settled on: composer_microbatch_size(microbatcher)), or train "
        "in your own loop or Ignite with unidist.MicroBatcher, which works on any device."
    )


def _device_name(device: Any) -> str:
    if device is None:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"  # what Composer's get_device does
    if isinstance(device, str):
        name = device.lower()
        if name not in _COMPOSER_DEVICES:
            raise ConfigurationError(
                f"device={device!r} is not a device name Composer's Trainer accepts "
                f"({', '.join(_COMPOSER_DEVICES)}). HINT: Composer calls CUDA 'gpu'."
            )
        return name
    try:
        from composer.devices import DeviceGPU
    except ImportError:  # no Composer, so no Composer device object either
        return type(device).__name__
    return "gpu" if isinstance(device, DeviceGPU) else type(device).__name__
