"""The benchmarks, one module a question, each run from the repository root as
``.venv/bin/python -m bench.NAME`` (bench/README.md says what each answers). ``helpers`` holds
what they share; ``cgroups`` is a library that nothing here imports back."""
