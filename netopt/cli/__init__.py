"""The command line (click): one module per command, `main.py` the group (see
docs/architecture.md). Empty on purpose: `netopt --help` imports only what it needs."""
