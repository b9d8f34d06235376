"""The storage app's services: :mod:`.retention` (retention, disk use, deletion, gc) and
:mod:`.agent_artifacts` (agents' artifact downloads and uploads)."""
