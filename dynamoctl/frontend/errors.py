"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the
status a client can act on (400 fix the request, 404 wrong model, 413 too big, 503 retry
later with ``Retry-After``)."""

from __future__ import annotations

from starlette.responses import JSONResponse


class OpenAIError(Exception):
    """Raised anywhere in request handling; the app turns it into the JSON error."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, round(self.retry_after)))
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def model_not_found(model: str, available: list[str]) -> OpenAIError:
    listing = ", ".join(sorted(available)) or "none are being served right now"
    return OpenAIError(
        404,
        f"The model '{model}' does not exist. Available: {listing}.",
        type="not_found_error",
        param="model",
        code="model_not_found",
    )


def overloaded(message: str, retry_after: float = 1.0) -> OpenAIError:
    return OpenAIError(
        503, message, type="service_unavailable", code="overloaded", retry_after=retry_after
    )
