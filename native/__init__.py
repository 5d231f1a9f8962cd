"""tether.native: the C units several components link (the image grammar, the job directories) and
the generated names header they all include (see build.py)."""
