from django.urls import path

from controlplane.dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.index, name="index"),
    path("experiments/<int:pk>/", views.experiment_detail, name="experiment"),
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("runs/<int:pk>/live/", views.run_live, name="run-live"),
]
