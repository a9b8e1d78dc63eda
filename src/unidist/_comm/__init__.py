"""How ranks talk underneath the public API, on a session given explicitly.

* :mod:`unidist._comm.transport`: the collectives over an adapter's primitives, for a session
  passed in (public :mod:`unidist.collectives` passes the active one; start-up passes the one it
  is still building, so a half-built session is never published).
* :mod:`unidist._comm.control`: unidist's control store, for waits that must end on time.
"""
