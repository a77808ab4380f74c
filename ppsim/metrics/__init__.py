"""Flat records (per request, per stage operation) and everything derived from them."""
