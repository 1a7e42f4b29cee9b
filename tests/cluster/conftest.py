"""The emulated hosts share this machine's cores (and two clusters run at once): ddlrun's checks, a Python import
per host at the same time, get a deadline that such a machine meets (an unreachable host's is tested in
tests/launch with the default)."""
import os

os.environ.setdefault("DDL_CHECK_SECONDS", "60")
