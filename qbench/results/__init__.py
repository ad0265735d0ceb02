"""Typed, frozen results of a sweep and their JSON form (results.json), read back and checked."""
