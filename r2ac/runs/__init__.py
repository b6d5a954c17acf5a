"""Task-neutral run plumbing, shared by `r2ac train` and `r2ac copy`.

checkpoint.py  atomic, checksummed, data-only checkpoint files; atomic writes; the lock
stop.py        SIGINT / SIGTERM -> a stop request honoured between updates
locked_dir.py  a locked directory (lock, stale temp files), JSON files, the git revision and
               the machine a run ran on
"""
