"""tether.container: runtime adapters and the `tether run` wrapper. Not built yet."""
