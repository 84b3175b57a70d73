"""The benchmark harness: sweep, warm-up, timing, checking, metrics; one small module per collective."""
