"""The benchmarks: each one a module run as ``python -m benchmarks.<name>``.

They start real processes on loopback (``tests.infra.procs``), print figures and
assert nothing about time; docs/benchmarks.md lists what each measures.  Their
smoke-sized runs are tests (``tests/benchmarks/test_smoke.py``).
"""
