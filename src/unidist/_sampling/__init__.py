"""Helpers of unidist's samplers, data loaders and streams (:mod:`unidist.samplers`,
:mod:`unidist.data`, :mod:`unidist.data.streams`): epoch orders, passes and resumable state, and the
frameworks' own samplers."""
