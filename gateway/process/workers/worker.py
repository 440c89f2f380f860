"""One worker of a multi-worker gateway: the shared port, the private socket and the summed views."""

from aiohttp import web

from gateway.process.workers.identity import WorkerIdentity
from gateway.process.workers.operator_views import sum_over_workers
from gateway.process.workers.private_app import private_app
from gateway.process.workers.siblings import Siblings

WORKER_HEADER = "x-kvgate-worker"


def make_worker(app: web.Application, identity: WorkerIdentity) -> Siblings:
    """Before the app starts: merge operator views over ``identity``'s siblings, name the worker
    on every response."""
    siblings = Siblings(identity)
    app.middlewares.append(sum_over_workers(siblings))
    worker = str(identity.index)

    async def name_worker(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[WORKER_HEADER] = worker

    app.on_response_prepare.append(name_worker)
    return siblings


async def start_private_site(app: web.Application, identity: WorkerIdentity) -> web.AppRunner:
    """After the app started: serve this worker's state to its siblings on its unix socket."""
    runner = web.AppRunner(private_app(app), access_log=None)
    await runner.setup()
    path = identity.socket_path()
    path.unlink(missing_ok=True)
    await web.UnixSite(runner, str(path)).start()
    return runner
