"""Checkpoints on torch.distributed.checkpoint: save, resume, reshard across layouts."""
