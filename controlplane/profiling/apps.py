from django.apps import AppConfig


class ProfilingConfig(AppConfig):
    name = "controlplane.profiling"
    label = "profiling"
