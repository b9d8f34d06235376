"""Planning: strategies (experiment description → allocation plan) and metrics.

Pure Python, NumPy and scikit-learn: no Django, no Celery, no torch. Plans are data in, data out,
so the planner can be tested and benchmarked without a database or a device.
"""
