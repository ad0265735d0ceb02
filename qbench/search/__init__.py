"""The recipe's INT8 search (`search:`): the fastest variant that passes the gate, found within a time budget.

candidates: the technique families tried; select: the decisions, as pure functions; screen: the screening rows
and gate verdicts as numbers; run: the search itself.
"""
