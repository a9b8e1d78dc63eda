"""The ground floor: what every other part of unidist may use, and which uses nothing of it.

Private to unidist; no user imports it. Each module stands alone (none imports another):

* :mod:`~unidist._base.checks`: argument checks in one wording (``{name} must be …, got …``).
* :mod:`~unidist._base.workarounds`: the torch and CPython bugs unidist works around, each with
  the versions it affects; the only place that touches torch's private names.
* :mod:`~unidist._base.frameworks`: the registry through which neutral code reaches an
  integration by name (so no framework is imported before it is used).
* :mod:`~unidist._base.migration`: pointers from Ignite's and Composer's names to unidist's.
* :mod:`~unidist._base.loaded`: the classes of a module already imported, for an ``isinstance``
  test that imports nothing.
* :mod:`~unidist._base.version`: the version string.

The error tree, :mod:`unidist.errors`, sits beside this folder on the same floor.
"""
