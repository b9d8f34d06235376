"""Pieces shared by the control plane's apps: the application error type."""
