# Stand-in for python:3.11-slim: Debian's Python 3.11 in a venv at /usr/local/python, first on
# PATH, so `python` and `pip` work as in the official image (Debian's own Python refuses
# system-wide pip installs, PEP 668).
ARG BASE
FROM ${BASE}
COPY ca/ /usr/local/share/ca-certificates/
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      python3 python3-venv ca-certificates >/dev/null \
 && update-ca-certificates >/dev/null \
 && python3 -m venv /usr/local/python \
 && rm -rf /var/lib/apt/lists/*
# pip and requests read the system bundle (with the site's CA), not certifi's.
ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    LANG=C.UTF-8
CMD ["python3"]
