"""The gate: results checked intact, fresh and as asked, then judged against the tolerances (fail closed)."""
