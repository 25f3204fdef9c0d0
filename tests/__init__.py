"""The test suite: ``unit/``, ``integration/`` and ``faults/``, with shared helpers in
``support/`` and the worker plug-ins of the tests in ``plugins/``."""
