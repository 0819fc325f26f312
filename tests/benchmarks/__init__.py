"""Benchmarks: scripts run by hand that print figures and ratios against peers; nothing here asserts a
time, and pytest collects nothing here."""
