"""The wire protocol shared by the control plane and device agents: message schemas (pydantic) and queue and task names. Imports neither torch nor Django."""
