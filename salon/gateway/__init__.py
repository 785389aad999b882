"""The gateway: the public salon.chat.v1.ChatService in front of a pool of engines.

servicer.py       ChatService: authenticate (tenants.py), validate (validate.py), admit (ratelimit.py)
dispatch.py       route, stream from the engine, fail over with resume tokens
routing.py        the routing rule (consistent hashing with bounded loads) behind RoutingPolicy; ring.py
membership.py     engines from config / DNS, health and load watches
sessions.py       where each dialogue was last served (in memory); sessions_redis.py (shared, degrades)
bootstrap.py      wiring for salon.common.server.serve (builds the parts from config.py); __main__.py
metrics.py        salon_gateway_* Prometheus metrics
"""
