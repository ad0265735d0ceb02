"""MLflow tracking: the sweep's runs, what they log, the store, and saved runs logged later."""
