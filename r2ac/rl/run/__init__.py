"""The run around any trainer: the run directory (config.json, metrics, checkpoints,
eval.json), the tracker (metrics.csv, TensorBoard, progress) and the training loop that every
trainer shares (loop.py). Below the runtimes and the streaming wing; above config and model."""
