"""The mtfl-lab control plane: Django apps holding state, the planner, the REST API and dashboard.

Import direction: ``controlplane`` may import :mod:`workers` (message schemas, queue names,
partitioning), never the reverse. ``controlplane.planning`` imports no Django, Celery or torch.
"""
