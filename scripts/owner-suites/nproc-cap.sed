# nproc-cap.sed -- applied to BOTH owner and shim copies when NPROC_CAP=2 (the default):
# Ignite's tests spawn 4 CPU workers when no GPU is present; this machine allows two
# test processes at once, so those worker counts become 2. The tests assert against
# the same variable, so what they check is unchanged. Set NPROC_CAP=0 to run as-is.
s/torch\.cuda\.device_count() if torch\.cuda\.is_available() else 4$/torch.cuda.device_count() if torch.cuda.is_available() else 2/
s/np = 4 if not torch\.cuda\.is_available() else torch\.cuda\.device_count()$/np = 2 if not torch.cuda.is_available() else torch.cuda.device_count()/
