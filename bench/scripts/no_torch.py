"""A rank's program that never imports torch (a data preparation step, a shell-like tool)."""

import os

print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}", flush=True)
