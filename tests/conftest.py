"""Test settings shared by every package: nothing global yet; paths live in tests/paths.py
(a plain module, because every folder's conftest.py is a module named `conftest`)."""
