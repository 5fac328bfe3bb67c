"""Utilities for training: logging, event storage and writers, checkpoints, distributed topology."""
