from django.templatetags.static import static
from django.urls import path
from django.views.generic.base import RedirectView

from controlplane.dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.index, name="index"),
    # Browsers ask for /favicon.ico on pages without a <link rel="icon"> (the API's JSON, files).
    path("favicon.ico", RedirectView.as_view(url=static("img/favicon.svg"), permanent=True), name="favicon"),
    path("devices/new/", views.device_new, name="device-new"),
    path("tasks/", views.task_list, name="tasks"),
    path("tasks/new/", views.task_new, name="task-new"),
    path("tasks/<int:pk>/", views.task_detail, name="task"),
    path("experiments/new/", views.experiment_new, name="experiment-new"),
    path("experiments/from-template/", views.experiment_from_template, name="experiment-from-template"),
    path("experiments/<int:pk>/", views.experiment_detail, name="experiment"),
    path("experiments/<int:pk>/compare/", views.experiment_compare, name="experiment-compare"),
    path("experiments/<int:pk>/runs/", views.run_new, name="run-new"),
    path("experiments/<int:pk>/collaborators/", views.experiment_collaborators, name="experiment-collaborators"),
    path("experiments/<int:pk>/delete/", views.experiment_delete_view, name="experiment-delete"),
    path("experiments/<int:pk>/results.json", views.experiment_json, name="experiment-json"),
    # before the run tables' <slug:table>.csv, which would take this name as a table
    path(
        "experiments/<int:pk>/label-histograms.csv",
        views.experiment_label_histograms_csv,
        name="experiment-label-histograms-csv",
    ),
    path("experiments/<int:pk>/<slug:table>.csv", views.experiment_csv, name="experiment-csv"),
    path("comparisons/<int:pk>/cancel/", views.comparison_cancel_view, name="comparison-cancel"),
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("runs/<int:pk>/live/", views.run_live, name="run-live"),
    path("runs/<int:pk>/cancel/", views.run_cancel_view, name="run-cancel"),
    path("runs/<int:pk>/delete/", views.run_delete_view, name="run-delete"),
    path("runs/<int:pk>/results.json", views.run_json, name="run-json"),
    path("runs/<int:pk>/<slug:table>.csv", views.run_csv, name="run-csv"),
    path("queue/", views.queue_page, name="queue"),
    path("queue/tables/", views.queue_tables, name="queue-tables"),
    path("devices/<int:pk>/pause/", views.device_pause_view, name="device-pause"),
    path("devices/<int:pk>/resume/", views.device_resume_view, name="device-resume"),
    path("predictors/", views.predictor_list, name="predictors"),
    path("predictors/new/", views.predictor_new, name="predictor-new"),
    path("profiling/new/", views.profile_new, name="profile-new"),
    path("profiling/sweeps/<int:pk>/", views.sweep_detail, name="sweep"),
    path("profiling/sweeps/<int:pk>/status/", views.sweep_status, name="sweep-status"),
    path("profiling/sweeps/<int:pk>/cancel/", views.sweep_cancel_view, name="sweep-cancel"),
    path("predictors/<int:pk>/", views.predictor_detail, name="predictor"),
]
