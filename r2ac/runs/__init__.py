"""Task-neutral run plumbing, shared by `r2ac train` and `r2ac copy`.

checkpoint.py  atomic, checksummed, data-only checkpoint files; atomic writes; the lock
stop.py        SIGINT / SIGTERM -> a stop request honoured between updates
run_dir.py     a locked run directory, its config.json meta (git revision) and JSON files
"""
