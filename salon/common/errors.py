"""Typed errors and their gRPC status codes, defined once.

Servicers raise these anywhere (unary or streaming handlers, or code they call); the error
interceptor in salon/common/interceptors.py turns them into the status code and message the
client sees. A message always says what was wrong, naming the offending field.
"""

from __future__ import annotations

import grpc

RETRY_AFTER_METADATA_KEY = "retry-after-ms"


class SalonError(Exception):
    """Base of the errors a client may see; `code` is the gRPC status it maps to."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()


class InvalidArgument(SalonError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class OutOfRange(SalonError):
    code = grpc.StatusCode.OUT_OF_RANGE


class ResourceExhausted(SalonError):
    """Over a limit (queue, rate, capacity). `retry_after_ms` hints when trying again may succeed."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        if self.retry_after_ms is None:
            return ()
        return ((RETRY_AFTER_METADATA_KEY, str(int(self.retry_after_ms))),)


class Unauthenticated(SalonError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(SalonError):
    code = grpc.StatusCode.PERMISSION_DENIED


class NotFound(SalonError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(SalonError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(SalonError):
    code = grpc.StatusCode.UNAVAILABLE


class Unimplemented(SalonError):
    code = grpc.StatusCode.UNIMPLEMENTED


class DeadlineExceeded(SalonError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Aborted(SalonError):
    code = grpc.StatusCode.ABORTED


class Internal(SalonError):
    code = grpc.StatusCode.INTERNAL
