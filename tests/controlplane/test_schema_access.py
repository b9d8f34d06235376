"""The OpenAPI schema (``/api/schema/``) and its Swagger UI (``/api/docs/``) need a login, as
docs/deployment.md's "Security and access" says of every page and API request: a session or a
token is served, an anonymous request is refused (the schema) or sent to the login page (the
docs page)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

OPENAPI_JSON = "application/vnd.oai.openapi+json"


def test_an_anonymous_schema_request_is_refused_with_401_in_the_api_error_format():
    response = APIClient().get("/api/schema/", HTTP_ACCEPT=OPENAPI_JSON)

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert response.json() == {"message": "Authentication credentials were not provided.", "errors": {}}


def test_an_anonymous_schema_request_gets_no_schema_in_any_format():
    for fmt in ("json", "yaml"):
        response = APIClient().get(f"/api/schema/?format={fmt}")
        assert response.status_code == 401, fmt
        assert b"openapi" not in response.content.lower(), fmt


def test_an_anonymous_visitor_of_the_docs_page_is_sent_to_the_login_page(client):
    response = client.get("/api/docs/")

    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/api/docs/"


def test_the_login_page_leads_back_to_the_docs_page(client, user):
    login_page = client.get("/api/docs/", follow=True)
    logged_in = client.post(
        "/accounts/login/?next=/api/docs/",
        {"username": "researcher", "password": "s3cret-pass", "next": "/api/docs/"},
    )

    assert login_page.status_code == 200 and b'name="password"' in login_page.content
    assert logged_in.status_code == 302 and logged_in["Location"] == "/api/docs/"
    assert client.get("/api/docs/").status_code == 200


def test_a_bad_token_on_the_docs_page_is_refused_not_redirected():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")

    response = client.get("/api/docs/")

    assert response.status_code == 401


def _openapi_document(response) -> dict:
    assert response.status_code == 200, response.content[:300]
    document = response.json()
    assert document["openapi"].startswith("3.") and "/api/experiments/{id}/runs/" in document["paths"]
    return document


def test_a_token_is_served_the_schema_and_the_docs_page(api):
    _openapi_document(api.get("/api/schema/", HTTP_ACCEPT=OPENAPI_JSON))

    docs = api.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content


def test_a_session_is_served_the_schema_and_the_docs_page(browser_client):
    _openapi_document(browser_client.get("/api/schema/", HTTP_ACCEPT=OPENAPI_JSON))

    docs = browser_client.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger-ui" in docs.content
    assert b"/api/schema/" in docs.content  # the page fetches the schema with the same session


def test_an_inactive_users_token_is_refused_the_schema(api, user):
    get_user_model().objects.filter(id=user.id).update(is_active=False)

    response = api.get("/api/schema/", HTTP_ACCEPT=OPENAPI_JSON)

    assert response.status_code == 401
