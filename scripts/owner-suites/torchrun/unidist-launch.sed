# unidist-launch.sed -- point torch's own test/distributed/launcher/test_run.py at
# `unidist launch`: the module the tests call as `launch` becomes the harness module
# unidist_as_torchrun (launch.main -> unidist.cli.main(["launch", *args])).
# Nothing else changes: patch targets ("torch.distributed.run.metadata", the agent,
# the rendezvous registry) stay torch's, and launch.parse_min_max_nnodes & co. are
# torch's own functions re-exported by unidist_as_torchrun ("internal API").
s/^import torch\.distributed\.run as launch$/import unidist_as_torchrun as launch  # unidist-launch.sed/
