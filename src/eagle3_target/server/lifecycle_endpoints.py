"""The JSON endpoints of a target's lifecycle beside training: new weights in place (POST /weights/refresh,
refresh.py, or sent by a trainer: POST /weights/broadcast and its outcome, refresh_broadcast.py) and a draft's
acceptance by speculative decoding (POST /v1/speculative/evaluate, speculative/)."""

from __future__ import annotations

from aiohttp import web

from eagle3_target.protocol import contract

from .service import TargetService
from .sessions import session_id


class LifecycleEndpoints:
    def __init__(self, service: TargetService):
        self.service = service

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/" + contract.REFRESH, self.refresh_weights, name="refresh"),
            web.post("/" + contract.BROADCAST, self.broadcast_weights, name="weights_broadcast"),
            web.post(
                "/" + contract.BROADCAST_OUTCOME, self.broadcast_outcome, name="weights_broadcast_outcome"
            ),
            web.post(contract.SPECULATIVE_EVALUATE, self.speculative_evaluate, name="speculative_evaluate"),
        ]

    async def refresh_weights(self, request: web.Request) -> web.Response:
        version = await self.service.refresh.refresh(request.headers, await request.read())
        return web.json_response({"version": version})

    async def broadcast_weights(self, request: web.Request) -> web.Response:
        # The group's store binds the address this request reached, as /init_nccl's does.
        address = request.transport.get_extra_info("sockname")[0]
        reply = await self.service.broadcast.announce(request.headers, await request.read(), address)
        return web.json_response(reply)

    async def broadcast_outcome(self, request: web.Request) -> web.Response:
        version = await self.service.broadcast.outcome(request.headers, await request.read())
        return web.json_response({"version": version})

    async def speculative_evaluate(self, request: web.Request) -> web.Response:
        session = session_id(request.headers.get(contract.SESSION_HEADER), request.remote)
        reply = await self.service.speculative.evaluate(session, await request.read())
        return web.json_response(reply)
