"""The launcher (docs/requirements.md, "The launcher"): submit, status, logs, cancel and cleanup of
jobs on behalf of users, state on the filesystem only, and a private REST interface (``tether
serve``).

The service runs as an ordinary account (``launcher.service_user``); everything it does to a
user's files or in a user's name runs as that user through ``sudo -u USER tether-agent`` -- the
only command the sudo policy lets it run -- with the request on stdin (tether.launcher.agent).
"""
