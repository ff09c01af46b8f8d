"""Planner: pure math on the same configs (no torch.distributed)."""
