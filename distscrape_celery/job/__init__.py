"""What a job is: its spec, its URLs and patterns, and seed files."""
