"""Task-neutral run plumbing, shared by `r2ac train` and `r2ac copy`.

checkpoint.py  atomic, checksummed checkpoint files of plain data; atomic writes; the lock
plain.py       what plain data is (all a checkpoint holds); numpy values in and out of it
older_checkpoints.py   older checkpoints (schema 1, bare torch.save) into plain data
schema.py, values.py   a loaded checkpoint's structure and values, checked before use
stop.py        SIGINT / SIGTERM -> a stop request honoured between updates
locked_dir.py  a locked directory (lock, stale temp files), JSON files, the git revision and
               the machine a run ran on
"""
