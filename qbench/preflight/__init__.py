"""Everything a sweep needs, checked before anything runs (`qbench validate`)."""
