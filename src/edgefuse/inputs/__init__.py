"""What the application reads: a MODEL named on the command line (a built-in model, a ``file.py:function``,
a ``.pt2`` read as data within bounds), and the errors a person can act on when it is wrong."""
