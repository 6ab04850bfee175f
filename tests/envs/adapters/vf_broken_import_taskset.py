"""A verifiers taskset package whose own import fails (a dependency it needs is missing): the
error is the package's, and keeps its traceback (test_verifiers.py)."""

import no_such_dependency_of_this_taskset  # noqa: F401
