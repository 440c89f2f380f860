"""How the gateway's parts are put together: the aiohttp app factory (routes, error shaping,
start-up and shutdown), the ``Gateway`` composition root that builds and holds every part, and
config hot reload with the guard that refuses an unsafe one."""
