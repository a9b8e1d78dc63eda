"""Where each rank is, for hang and straggler attribution (``unidist launch``, ``run_distributed``).

``record.py`` is the rank's progress record (a shared-memory page); ``sampler.py`` the rank's
thread that writes it; ``verdict.py`` the pure rules that turn every rank's record into the one
line a hang report starts with, the adaptive timeout and the straggler report.
"""
