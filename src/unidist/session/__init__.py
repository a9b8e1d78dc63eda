"""The session: a process's one connection to its job, and how its ranks talk underneath.

The public names here reach users through :mod:`unidist` (``unidist.initialize``,
``unidist.finalize``, ``unidist.device``, ...); the modules, bottom up:

* :mod:`~unidist.session.wire`, :mod:`~unidist.session.link`, :mod:`~unidist.session.listen`,
  :mod:`~unidist.session.control`: unidist's TCP control store, for waits that must end on time.
* :mod:`~unidist.session.transport`: the collectives over an adapter's primitives, for a session
  passed in explicitly (public :mod:`unidist.collectives` passes the active one; start-up passes
  the one it is still building, so a half-built session is never published).
* :mod:`~unidist.session.communicator`: the session's one communicator, chosen once by
  ``initialize`` (over the control store, over a framework's helpers, or for one process).
* :mod:`~unidist.session.state`: the one slot of global state (the published session).
* :mod:`~unidist.session.devices`: which device this process trains on, and its backend.
* :mod:`~unidist.session.lifecycle`: ``initialize``, ``finalize``, ``use``: start or adopt a
  process group, build the session, publish it.

It imports the adapters and environments below it, never a feature above it.
"""
