"""Installed only into the test venv of ``make test`` (tests/vllm_tree_tests.py venv)."""
