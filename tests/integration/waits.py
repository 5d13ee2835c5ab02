"""Bounded waits for the integration tests: one helper for every module.

wait_for(pred, what, timeout, step) polls pred() every step seconds on the
monotonic clock and returns its first true value; after timeout seconds it
fails the test with AssertionError naming what it waited for. Every wait of
the suite is bounded so: a test never hangs where an error belongs.
"""
import time


def wait_for(pred, what="condition", timeout=30.0, step=0.1):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= end:
            raise AssertionError("timed out after %ss waiting for %s" %
                                 (timeout, what))
        time.sleep(step)
