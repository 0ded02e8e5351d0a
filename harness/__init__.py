"""The one place test logic lives: discovery, cases from regimes, checks, the CLI and the device layer."""
