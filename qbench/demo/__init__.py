"""Offline demos: small models and data tables built on this machine, ready for a recipe.

`python -m qbench.demo.digits --out .` trains a digits CNN and writes the model
and the data table that `recipes/digits.yaml` names. Demos need the `demo`
extra (torch, scikit-learn); importing this package imports neither.
"""
