"""Helpers of :class:`unidist.MicroBatcher` (:mod:`unidist.microbatch`): splitting a batch, the
size policy, out-of-memory classification and freeing, and gradient bookkeeping.

:mod:`~unidist._microbatch.memory` (``is_oom``) imports nothing heavy, so ``import unidist`` can
export :func:`unidist.is_oom`; the others import torch only when they run.
"""
