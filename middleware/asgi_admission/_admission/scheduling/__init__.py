"""Scheduling: priority classes, the bounded wait for capacity, and fair share by tenant."""
