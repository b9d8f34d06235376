"""WSGI entry point (gunicorn ``controlplane.wsgi:application``)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
application = get_wsgi_application()

# Everything loaded so far (Django, DRF, the URL conf, the serializers) lives as long as the
# process: moved out of the collector's generations, a full collection no longer walks those
# hundreds of thousands of objects in the middle of a request.
import gc  # noqa: E402

gc.freeze()
