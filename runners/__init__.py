"""devplace runners."""
