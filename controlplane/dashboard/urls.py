from django.urls import path

from controlplane.dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.index, name="index"),
    path("experiments/<int:pk>/", views.experiment_detail, name="experiment"),
    path("experiments/from-template/", views.experiment_from_template, name="experiment-from-template"),
    path("experiments/<int:pk>/compare/", views.experiment_compare, name="experiment-compare"),
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("runs/<int:pk>/live/", views.run_live, name="run-live"),
    path("tasks/<int:pk>/", views.task_detail, name="task"),
    path("predictors/", views.predictor_list, name="predictors"),
    path("predictors/<int:pk>/", views.predictor_detail, name="predictor"),
]
