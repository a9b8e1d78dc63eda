"""A rank that draws a tqdm progress bar on stderr (what Composer's and Ignite's bars use)."""

from __future__ import annotations

import os
import sys
import time

from tqdm import tqdm

rank = int(os.environ["RANK"])
print(f"rank {rank} starts", flush=True)
for _ in tqdm(range(30), desc=f"rank{rank}", file=sys.stderr, mininterval=0, ascii=True):
    time.sleep(0.02)
print(f"rank {rank} done", flush=True)
