"""A disaggregated-serving proxy for two vLLM engines joined by TandemConnector (or any
connector speaking NixlConnector's kv_transfer_params), following the flow of vLLM's
disaggregated-serving example: each /v1/completions request goes first to the prefill engine
with max_tokens 1 and kv_transfer_params {"do_remote_decode": true}; the params that engine
returns (its engine id and endpoint, the request and its blocks) are passed with the original
request to the decode engine, whose answer (streamed or not) is returned to the client.

    python proxy.py --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 --port 8000

A failure of either engine is returned as an HTTP error whose body says which engine failed
and why. Needs aiohttp (a vLLM dependency).
"""
import argparse
import json

import aiohttp
from aiohttp import web


def make_app(prefill: str, decode: str) -> web.Application:
    app = web.Application()
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)

    async def start(app_):
        # one connection per request: a pooled keep-alive connection that the engine's server
        # closes as it is reused fails the request (ServerDisconnectedError)
        app_["session"] = aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(force_close=True, limit=0))

    async def stop(app_):
        await app_["session"].close()

    async def completions(request: web.Request):
        try:
            return await forward(request)
        except aiohttp.ClientError as e:   # an engine unreachable or gone mid-request
            return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=502)

    async def forward(request: web.Request):
        body = await request.json()
        session = app["session"]
        pre = dict(body, max_tokens=1, stream=False,
                   kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False})
        pre.pop("stream_options", None)
        pre.pop("min_tokens", None)
        try:
            async with session.post(prefill + "/v1/completions", json=pre) as r:
                text = await r.text()
                status = r.status
        except aiohttp.ClientError as e:
            return web.json_response({"error": f"prefill engine: {type(e).__name__}: {e}"},
                                     status=502)
        if status != 200:
            return web.json_response({"error": f"prefill engine: HTTP {status}: {text[:500]}"},
                                     status=502)
        params = json.loads(text).get("kv_transfer_params")
        if not params:
            return web.json_response({"error": "prefill engine returned no kv_transfer_params "
                                               "(is its kv-transfer-config set?)"}, status=502)
        dec = dict(body, kv_transfer_params=params)
        async with session.post(decode + "/v1/completions", json=dec) as r:
            if r.status != 200:
                text = await r.text()
                return web.json_response({"error": f"decode engine: HTTP {r.status}: {text[:500]}"},
                                         status=502)
            if not body.get("stream"):
                return web.Response(body=await r.read(), content_type="application/json")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            async for chunk in r.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def health(_request):
        return web.Response(text="ok")

    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill", required=True, help="the prefill engine's base URL")
    ap.add_argument("--decode", required=True, help="the decode engine's base URL")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    a = ap.parse_args()
    web.run_app(make_app(a.prefill.rstrip("/"), a.decode.rstrip("/")), host=a.host, port=a.port,
                print=None)


if __name__ == "__main__":
    main()
