# composer-shim.sed -- point Composer's own dist tests at unidist.compat.composer.
# Applied to tests/utils/test_dist.py only; Composer's conftest and fixtures
# (which initialise the process group through composer.utils.dist) are kept as-is.
s/^\([[:space:]]*\)from composer\.utils import dist[[:space:]]*$/\1import unidist.compat.composer as dist/
# The patch target 'composer.utils.dist.dist.is_initialized' is the attribute
# torch.distributed.is_initialized reached through Composer's module (the same object);
# name it directly so the test does not need Composer installed to patch it.
s/'composer\.utils\.dist\.dist\.is_initialized'/'torch.distributed.is_initialized'/
