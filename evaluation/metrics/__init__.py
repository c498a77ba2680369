"""Evaluation metrics: pure functions of the samples table."""
