"""The hypothesis profile (no deadline, deterministic draws) is set for every test in `tests/conftest.py`."""
