"""Access to the admin endpoints (/admin/*, dashboard, stats)."""

import ipaddress

from aiohttp import web

from gateway.admission.bearer import bearer_token, key_matches, unauthorized
from gateway.errors import OpenAIError
from gateway.state import GATEWAY


def require_admin(request: web.Request) -> None:
    """Raise 401/403 unless the caller may use admin endpoints.

    With `admin.api_key` configured the request must carry it as a Bearer key; without one,
    only loopback clients are served.
    """
    admin_key = request.app[GATEWAY].config.admin.api_key
    if admin_key is None:
        if not _is_loopback(request.remote):
            raise OpenAIError(
                403, "Admin endpoints answer loopback clients only unless admin.api_key is set.", code="forbidden"
            )
        return
    given = bearer_token(request)
    if given is None or not key_matches(given, admin_key.get_secret_value()):
        raise unauthorized("This endpoint needs the admin API key.")


def _is_loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:
        return False
