"""The pure core: decisions over plain dicts. No I/O, threads, clocks or environment."""
