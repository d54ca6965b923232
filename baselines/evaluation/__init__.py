"""Evaluation on a fixed test set (``python -m baselines.evaluate``): learned meta-policies and fixed protocols side by
side, one episode runner, bootstrap intervals, tables and plots (``evaluate``); used by both products.
"""
