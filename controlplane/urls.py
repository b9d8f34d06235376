from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from controlplane.core.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/", include("controlplane.api.urls")),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("controlplane.dashboard.urls")),
]

# A URL under /api/ that no route matches answers with the API's JSON error body.
handler404 = "controlplane.api.exception_handlers.not_found"
