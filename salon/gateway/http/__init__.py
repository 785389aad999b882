"""The OpenAI-compatible HTTP front of the gateway (FastAPI on uvicorn, in the gateway's event loop).

    app.py        the ASGI app and the uvicorn server bound to `--http-port`
    routes.py     /v1/chat/completions, /v1/completions, /v1/models, /tokenize, /detokenize, /health
    probes.py     /ready, /version and /metrics (unauthenticated; /openapi.json comes from FastAPI)
    responses.py  /v1/responses: the Responses API over the chat path, stored responses continued by id
    responses_schema.py  its request body;  responses_answer.py  a response as a body or typed SSE events
    schemas.py    pydantic models of the request bodies (unknown and unsupported fields are refused)
    convert.py    OpenAI requests -> salon.engine.v1 requests; finish reasons, usage, log-probs back
    choices.py    running the n choices of one completion through the dispatcher (prefilled once)
    completion.py one completion's events as a response body or SSE chunks; owns its admission slot and span
    catalog.py    the served models (404 for others) and unary calls to any engine (tokenize)
    errors.py     OpenAI error objects with the HTTP status of each salon error
    body_limit.py the body read whole and capped (413) before any route sees it
    body_parse.py JSON + validation: small bodies on the loop, large ones in a worker process
    bounds.py     a parsed body's counts against the model's context (400 before conversion)
    slow_clients.py  a deadline on each request's head (slowloris)

The request's span carries the GenAI attributes of salon/gateway/genai_span.py.

It shares the gRPC front's core: tenants, admission, routing, dispatcher and failover.
"""
