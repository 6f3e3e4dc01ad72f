"""devplace placement environments (Gymnasium) and oracles."""
