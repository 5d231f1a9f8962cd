"""tether.system: tether's door to the operating system, with no tether policy in it.

proc (the one subprocess entry point), files (files written whole, directories with exact modes,
other programs' config lines), toolchain (compiling tether's C against the installed Slurm and a
Python every job user can read).
"""
