"""Panel monitoring app for HMDSPT run logs (reads only the run log)."""
