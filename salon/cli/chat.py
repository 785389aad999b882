"""`salon chat`: an interactive terminal client that streams replies from the gateway.

Each line you type is a user message; the character's reply streams back token by token. The whole
dialogue is re-sent every turn (as a product backend does), and the usage line after each reply shows
how much of it came from the cross-turn KV cache. Ctrl-C while a reply streams stops it (the call is
cancelled, so the engine stops too; what came so far stays in the dialogue); at the prompt, Ctrl-C, Ctrl-D or
a line of its own `/quit` (or `/exit`, `/bye`) quits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import uuid

import grpc

from salon.api.chat.v1 import chat_pb2, chat_pb2_grpc
from salon.cli.piped_lines import PipedLines

DEFAULT_CHARACTER = (
    "Ada is a warm, witty engineer who loves explaining how things work with small concrete examples. "
    "She answers briefly, in plain words."
)


# A line that is one of these (and nothing else) quits instead of being sent.
QUIT_COMMANDS = frozenset({"/quit", "/exit", "/bye"})

_ENDED = {
    chat_pb2.FINISH_REASON_STOP_TOKEN: "end of turn",
    chat_pb2.FINISH_REASON_LENGTH: "token limit",
    chat_pb2.FINISH_REASON_CONTEXT_FULL: "context full",
    chat_pb2.FINISH_REASON_STOP_STRING: "stop string",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="salon chat", description=__doc__.splitlines()[0])
    p.add_argument("--target", default=os.environ.get("SALON_GATEWAY", "127.0.0.1:50051"), help="gateway host:port")
    p.add_argument("--api-key", default=os.environ.get("SALON_API_KEY", "salon-dev-key"), help="tenant API key")
    p.add_argument("--conversation-id", default=None, help="continue this dialogue id (default: a new one)")
    p.add_argument("--character-name", default="Ada")
    p.add_argument("--character", default=DEFAULT_CHARACTER, help="character definition")
    p.add_argument("--model", default="", help="served model to chat with (default: the stack's default model)")
    p.add_argument("--user-name", default="", help="your name, sent as the author of your messages (default: none)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="reply budget (default: the engine's)")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (default: the model's)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling (default: the model's)")
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=None,
        help="vLLM's repetition_penalty, 1 = off (default: the model's)",
    )
    return p


# Sampling fields salon chat leaves to the model unless a flag sets them (SamplingParams.model_default_fields).
MODEL_DEFAULT_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")


def sampling_params(args: argparse.Namespace) -> chat_pb2.SamplingParams:
    """Only what the flags set; every other sampling field takes the model's default (ModelInfo.default_sampling)."""
    explicit = {name: getattr(args, name) for name in MODEL_DEFAULT_FIELDS if getattr(args, name, None) is not None}
    return chat_pb2.SamplingParams(
        max_new_tokens=args.max_new_tokens or 0,
        model_default_fields=[name for name in MODEL_DEFAULT_FIELDS if name not in explicit],
        **explicit,
    )


async def chat_loop(args: argparse.Namespace, lines, out=sys.stdout) -> int:
    conversation_id = args.conversation_id or uuid.uuid4().hex
    history: list[chat_pb2.Message] = []
    metadata = (("authorization", f"Bearer {args.api_key}"),)
    async with grpc.aio.insecure_channel(args.target) as channel:
        stub = chat_pb2_grpc.ChatServiceStub(channel)
        try:
            info = await stub.GetModelInfo(
                chat_pb2.GetModelInfoRequest(model=args.model), metadata=metadata, timeout=30
            )
            eos_ids = set(info.model.eos_token_ids)
        except grpc.aio.AioRpcError as exc:
            out.write(f"cannot reach the gateway at {args.target}: {exc.code().name}: {exc.details()}\n")
            return 1
        model = info.model.model_id
        out.write(
            f"conversation {conversation_id} with {args.character_name} on {model} "
            "(Ctrl-C stops a reply, Ctrl-D or /quit quits)\n"
        )
        for line in lines:
            text = line.rstrip("\n")
            if not text.strip():
                continue
            if text.strip() in QUIT_COMMANDS:
                break
            history.append(chat_pb2.Message(role=chat_pb2.ROLE_USER, author=args.user_name, text=text))
            request = chat_pb2.GenerateRequest(
                conversation_id=conversation_id,
                character=chat_pb2.Character(name=args.character_name, definition=args.character),
                dialogue=chat_pb2.Dialogue(messages=history),
                sampling=sampling_params(args),
                model=model,
            )
            reply_ids: list[int] = []
            out.write(f"{args.character_name}: ")
            reply = asyncio.ensure_future(_stream_reply(stub.Generate(request, metadata=metadata), reply_ids, out))
            with _sigint_cancels(reply):
                await asyncio.wait({reply})
            if reply.cancelled():
                out.write(f"\n  [stopped after {len(reply_ids)} tokens]\n")
                if not reply_ids:  # nothing was said: the message goes too, as after an error
                    history.pop()
                    continue
            elif (exc := reply.exception()) is not None:
                if not isinstance(exc, grpc.aio.AioRpcError):
                    raise exc
                out.write(f"\n  error: {exc.code().name}: {exc.details()}\n")
                history.pop()
                continue
            # Send the reply back as the token ids the model generated (not re-tokenized text), so the next
            # turn's prompt extends this turn's tokens exactly and the cross-turn cache hits in full.
            while reply_ids and reply_ids[-1] in eos_ids:
                reply_ids.pop()
            history.append(
                chat_pb2.Message(role=chat_pb2.ROLE_CHARACTER, author=args.character_name, token_ids=reply_ids)
            )
    return 0


async def _stream_reply(call, reply_ids: list[int], out) -> None:
    """One reply's events onto `out` (its text, then the usage line), its token ids into reply_ids. Cancelled, it
    cancels the call (the engine stops generating)."""
    try:
        async for event in call:
            if event.HasField("delta"):
                reply_ids.extend(event.delta.token_ids)
                out.write(event.delta.text)
                out.flush()
            else:
                usage = event.final.usage
                cached = usage.cached_tokens.device + usage.cached_tokens.host
                out.write(
                    f"\n  [{usage.prompt_tokens} prompt tokens, {cached} cached, "
                    f"{usage.generated_tokens} generated, ttft {event.final.timings.ttft_ms:.0f} ms, "
                    f"engine {event.final.engine_id}, {_ENDED.get(event.final.finish_reason, 'ended')}]\n"
                )
    except asyncio.CancelledError:
        call.cancel()
        raise


@contextlib.contextmanager
def _sigint_cancels(task: asyncio.Future):
    """While inside: SIGINT (Ctrl-C) cancels `task` instead of raising KeyboardInterrupt; after, Ctrl-C interrupts
    as Python's default handler does (at the prompt: quit). Where the loop cannot take signals (not the main
    thread), nothing changes."""
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, task.cancel)
    except (RuntimeError, ValueError, NotImplementedError):
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)  # (back to Python's default_int_handler)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    read = input if sys.stdin.isatty() else PipedLines().read

    def lines():
        while True:
            try:
                yield read(f"{args.user_name or 'You'}: ")
            except EOFError:
                return

    # Not asyncio.run: its SIGINT handler would swallow the first Ctrl-C at the prompt (it cancels the task, and
    # input() goes on waiting); with Python's own, Ctrl-C at the prompt quits at once.
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(chat_loop(args, lines()))
    except KeyboardInterrupt:
        print()
        return 0
    finally:
        loop.close()
