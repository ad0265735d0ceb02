"""Human-readable views of a sweep: console tables, report.md and report.html."""
