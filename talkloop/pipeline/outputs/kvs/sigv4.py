"""AWS Signature Version 4 for the PutMedia request head (botocore's signer, our headers).

The body of a PutMedia request is streamed for as long as the session lasts, so it cannot be
hashed up front: the request is signed with the SHA-256 of an empty payload, as the community
PutMedia clients do. Transfer-Encoding and User-Agent are never signed (botocore leaves them
out on purpose: proxies may rewrite them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["SERVICE", "sign_request_headers"]

SERVICE = "kinesisvideo"


def sign_request_headers(
    method: str,
    url: str,
    headers: Mapping[str, str],
    credentials: Any,
    region: str,
    service: str = SERVICE,
) -> dict[str, str]:
    """Return ``headers`` plus Host, X-Amz-Date, X-Amz-Security-Token (if any) and Authorization.

    Args:
        method: HTTP method, e.g. ``"POST"``.
        url: the full request URL (scheme, host, optional port, path).
        headers: the headers to send and sign.
        credentials: botocore credentials (``get_frozen_credentials()`` of a session's).
        region: the region the endpoint belongs to.
        service: the signing name (``kinesisvideo`` for every KVS API).
    """
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    request = AWSRequest(method=method, url=url, headers=dict(headers), data=b"")
    SigV4Auth(credentials, service, region).add_auth(request)
    signed = dict(request.headers.items())
    if not any(k.lower() == "host" for k in signed):
        # botocore signs with the URL's host but leaves the header to the HTTP layer; we are
        # the HTTP layer, so send exactly what was signed.
        signed["Host"] = _host_header(url)
    return signed


def _host_header(url: str) -> str:

    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    host = parts.hostname or ""
    return host if parts.port in (None, default) else f"{host}:{parts.port}"
