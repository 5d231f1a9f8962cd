"""tether.spank: the SPANK plugin (cffi C shim and its Python callbacks). Not built yet."""
