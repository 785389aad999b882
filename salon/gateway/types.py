"""Ids shared by the gateway's modules. Plain strings at runtime; NewType keeps them apart in signatures."""

from __future__ import annotations

from typing import NewType

# Stable id of one engine replica (e.g. "e0"); the ring and the session table speak in these.
EngineId = NewType("EngineId", str)
# The backend's dialogue id: the sticky-routing key.
ConversationId = NewType("ConversationId", str)
# A tenant's name in the tenant table (never its API key). Letters, digits, '_', '.', '-' only.
TenantId = NewType("TenantId", str)
# A dialogue as the gateway routes it: `<tenant_id>/<conversation_id>`. Conversation ids are chosen by
# each tenant, so two tenants' "1" are different dialogues: they hash apart on the ring and never share
# a session entry. Unambiguous because tenant ids cannot contain '/'.
DialogueKey = NewType("DialogueKey", str)
# A stored response of the Responses API as the session table keys it: `<tenant_id>/<response id>`, so
# one tenant's lookup of another tenant's response id finds nothing.
ResponseKey = NewType("ResponseKey", str)


def dialogue_key(tenant_id: TenantId, conversation_id: str) -> DialogueKey:
    return DialogueKey(f"{tenant_id}/{conversation_id}")


def response_key(tenant_id: TenantId, response_id: str) -> ResponseKey:
    return ResponseKey(f"{tenant_id}/{response_id}")
