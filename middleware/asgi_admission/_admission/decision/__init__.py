"""The decision: the latch over memory readings, its reserve, its log lines and its observer."""
