"""The OpenAI-compatible HTTP endpoints: GET /v1/models, POST /v1/completions and /v1/chat/completions,
whole or streamed as server-sent events, over GenerationService. Errors under /v1 are OpenAI's shape
(middlewares.json_errors)."""

from __future__ import annotations

import logging

from aiohttp import web

from eagle3_target.protocol import contract

from . import openai_replies
from .errors import ServiceError
from .generation import GenerationService, context_length
from .openai_request import parse_ask
from .sessions import session_id

log = logging.getLogger(__name__)

MODELS, COMPLETIONS, CHAT = "/v1/models", "/v1/completions", "/v1/chat/completions"


class OpenAIEndpoints:
    def __init__(self, generation: GenerationService):
        self.generation = generation

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get(MODELS, self.models, name="v1.models"),
            web.post(COMPLETIONS, self.completions, name="v1.completions"),
            web.post(CHAT, self.chat, name="v1.chat.completions"),
        ]

    async def models(self, request: web.Request) -> web.Response:
        runner = self.generation.runner()
        length = context_length(runner)
        body = openai_replies.models_body(runner.info.model, self.generation.model.loaded_at, length)
        return web.json_response(body)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        runner = self.generation.runner()
        cap = self.generation.options.max_tokens
        ask = parse_ask(await request.read(), chat=chat, served=runner.info.model, max_tokens_cap=cap)
        session = session_id(request.headers.get(contract.SESSION_HEADER), request.remote)
        generation = await self.generation.start(ask, session, request.headers.get(contract.PRIORITY_HEADER))
        reply = openai_replies.Reply.start(ask.model, chat)
        if not ask.stream:
            pieces = [piece async for piece in generation.pieces]
            used = openai_replies.usage(generation.prompt_tokens, generation.completion_tokens)
            return web.json_response(reply.whole("".join(p.text for p in pieces), pieces[-1].finish, used))
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        if chat:
            await response.write(reply.chunk("", first=True))  # the role comes first, as OpenAI sends it
        try:
            async for piece in generation.pieces:
                await response.write(reply.chunk(piece.text, piece.finish))
        except ServiceError as exc:  # the status is sent: the error goes as an event, as vLLM does
            log.warning("%r: generation failed mid-stream: %s", request.path, exc.detail)
            await response.write(openai_replies.sse(openai_replies.error_body(400, exc.error, exc.detail)))
        finally:  # a client that left (the write raised) ends its generation now, not when it is collected
            await generation.pieces.aclose()
        if ask.include_usage:
            used = openai_replies.usage(generation.prompt_tokens, generation.completion_tokens)
            await response.write(reply.usage_chunk(used))
        await response.write(openai_replies.DONE)
        await response.write_eof()
        return response
