"""Helpers of :mod:`unidist.resume`: the checkpoint folder and the stop signals."""
