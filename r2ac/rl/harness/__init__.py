"""The run around the learning: command line, run directory, logging, evaluation.

train_cli.py     `r2ac train`
run_dir.py       `RunDir`: a training run's directory (config.json, metrics, checkpoints)
tracker.py       metrics, progress, CSV / TensorBoard
evaluate.py      `r2ac eval` (the evaluation protocol)
diagnostics.py   a run's gradient split (in-segment vs history) and critic
diagnose_cli.py  `r2ac diagnose RUN`
resources.py     the memory check before a run starts
"""
