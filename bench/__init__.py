"""Benchmarks (not tests): each module has a ``main()`` that measures and prints its figures.

Run them all with ``python -m bench`` (``make bench``), or one with ``python -m bench.<module>``.
"""
