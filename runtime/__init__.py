"""devplace runtime."""
