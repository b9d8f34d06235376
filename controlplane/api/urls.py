from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import DefaultRouter

from controlplane.api import agent_views, lab_views, views
from controlplane.api.schema_views import SwaggerUiView

router = DefaultRouter()
router.register("devices", views.DeviceViewSet, basename="device")
router.register("tasks", views.TaskViewSet, basename="task")
router.register("experiments", views.ExperimentViewSet, basename="experiment")
router.register("experiment-templates", views.ExperimentTemplateViewSet, basename="experiment-template")
router.register("comparisons", views.ComparisonViewSet, basename="comparison")
router.register("runs", views.RunViewSet, basename="run")
router.register("rounds", views.RoundViewSet, basename="round")
router.register("assignments", views.AssignmentViewSet, basename="assignment")
router.register("checkpoints", views.CheckpointViewSet, basename="checkpoint")
router.register("workloads", views.ModelWorkloadViewSet, basename="workload")
router.register("profile-sweeps", views.ProfileSweepViewSet, basename="profile-sweep")
router.register("profile-samples", views.ProfileSampleViewSet, basename="profile-sample")
router.register("predictors", views.PredictorViewSet, basename="predictor")
router.register("pools", lab_views.PoolViewSet, basename="pool")

urlpatterns = [
    # Both need a login (SPECTACULAR_SETTINGS["SERVE_PERMISSIONS"]); the docs page redirects to it.
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SwaggerUiView.as_view(url_name="schema"), name="docs"),
    # Device agents only (Authorization: Agent <key>), see controlplane/api/agent_views.py.
    path("agent/device/", agent_views.AgentDeviceApi.as_view(), name="agent-device"),
    path("agent/artifacts/<path:key>", agent_views.AgentArtifactApi.as_view(), name="agent-artifact"),
    path("plugins/", views.PluginsApi.as_view(), name="plugins"),
    path("queue/", lab_views.QueueApi.as_view(), name="queue"),
    path("devices/<int:id>/pause/", lab_views.DevicePauseApi.as_view(), name="device-pause"),
    path("devices/<int:id>/resume/", lab_views.DeviceResumeApi.as_view(), name="device-resume"),
    path("storage/", views.StorageApi.as_view(), name="storage"),
    path("", include(router.urls)),
]
