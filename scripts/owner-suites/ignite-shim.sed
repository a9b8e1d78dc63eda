# ignite-shim.sed -- point the public ignite.distributed API used by Ignite's own
# tests at unidist.compat.ignite. Applied to tests/ignite/distributed/**/*.py only
# (Ignite's conftest.py and tests/ignite/__init__.py are kept as the owner wrote them).
# Imports of Ignite internals (names starting with "_", ignite.distributed.comp_models,
# ignite.engine) are left alone on purpose: those tests have no counterpart in the shim.

# import ignite.distributed as idist  (module-level and function-level)
s/^\([[:space:]]*\)import ignite\.distributed as idist[[:space:]]*$/\1import unidist.compat.ignite as idist/

# The one mixed line in tests/ignite/distributed/utils/__init__.py: keep the private
# helper from Ignite, take the public ones from the shim.
s/^\([[:space:]]*\)from ignite\.distributed\.utils import _rank_not_in_group, all_gather_tensors_with_shapes, sync[[:space:]]*$/\1from ignite.distributed.utils import _rank_not_in_group\
\1from unidist.compat.ignite import all_gather_tensors_with_shapes, sync/

# from ignite.distributed[.utils|.auto] import a, b, c   -- only when no imported name is private
/^[[:space:]]*from ignite\.distributed\(\.utils\|\.auto\)\{0,1\} import [^(]*$/{
  /import _\|[ ,]_/!s/^\([[:space:]]*\)from ignite\.distributed\(\.utils\|\.auto\)\{0,1\} import /\1from unidist.compat.ignite import /
}
