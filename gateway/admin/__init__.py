"""The operator's ``/admin/*`` endpoints: one sub-app behind the admin key, with
``GET /admin/backends`` (what admission sees per replica, queue and tenant) and
``POST /admin/reload`` (the reload itself is ``gateway/wiring/reload.py``'s)."""
