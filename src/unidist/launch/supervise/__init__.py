"""The launcher process: it runs a plan, watches the ranks and reports how they ended.

``runner`` (torch's elastic agent, the run folder), ``supervisor`` (the one owner of what the
launcher knows of its ranks, fed by ``events``; the final sweep), ``watch`` (each rank's state),
``hang`` (stuck ranks and stragglers), ``report`` (culprit versus collateral, exit codes),
``console`` (the ranks' output on the launcher's terminal), ``relay`` (the other nodes'
launchers), ``notices`` (what the launchers write to the rendezvous store for each other, and
how it is read), ``excerpts`` (what a report quotes from a rank's logs), ``exits`` (when each
rank's process ended), ``procs`` (which processes are the ranks, and signalling them),
``failures`` (what the launcher says when torch's agent or its rendezvous fails), ``outcome``
(how one rank ended).
"""
