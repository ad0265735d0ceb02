"""The recipe: the YAML file's schema, one module per section, loaded and checked strictly."""
