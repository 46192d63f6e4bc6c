"""The session watchdog: per-session sampling, halts, and their metrics."""
