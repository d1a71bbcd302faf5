# SPDX-License-Identifier: Apache-2.0
"""The DCP gate harness (evidence/dcp_gate.py): plan, launch, compare.

``plan``     configurations, seeded prompts, per-rank launch environments (pure Python);
``verdict``  comparison of two runs, noise floor, tolerance, sensitivity, negative control and
             the result schema (pure Python, tested on CPU in tests/test_dcp_gate.py);
``worker``   what one rank runs inside vLLM (engine, passes, the test-only fault).
"""
