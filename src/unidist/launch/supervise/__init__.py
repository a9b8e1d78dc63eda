"""The launcher process: it runs a plan, watches the ranks and reports how they ended.

``runner`` (torch's elastic agent, the watchdog, the final sweep), ``watch`` (each rank's state),
``hang`` (stuck ranks and stragglers), ``report`` (culprit versus collateral, exit codes),
``console`` (the ranks' output on the launcher's terminal), ``relay`` (the other nodes'
launchers), ``exits`` (what an exit code means).
"""
