"""devplace agents."""
