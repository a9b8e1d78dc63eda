"""Where each rank is, for hang and straggler attribution (``unidist launch``, ``run_distributed``).

``page.py`` is the rank's page (a small shared-memory file of facts about where it is);
``stacks.py`` the rank's thread that looks at its stack and writes the page; ``verdict.py`` the
pure rules that turn every rank's page into the one line a hang report starts with, the adaptive
timeout and the straggler report.
"""
