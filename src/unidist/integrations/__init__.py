"""Framework integrations of unidist features, each importing its framework lazily.

* :mod:`unidist.integrations.ignite`: Ignite trainers and update functions with automatic
  microbatching (``create_microbatch_trainer``, ``microbatch_training_step``).
* :mod:`unidist.integrations.composer`: unidist's microbatch setting as Composer's
  ``device_train_microbatch_size`` (``composer_microbatch_size``).
"""

from __future__ import annotations

__all__: list[str] = []
