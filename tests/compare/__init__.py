"""Tests of stock against edgefuse (``edgefuse.compare``): reports, checked programs, the delegate map."""
