"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the
status a client can act on (400 fix the request, 401 wrong API key, 404 wrong model, 413
too big, 503 retry later with ``Retry-After``; 500 is a bug, and closes the
connection)."""

from __future__ import annotations

from starlette.responses import JSONResponse


class ParamError(ValueError):
    """A request validator's refusal that names the parameter at fault, for the checks
    of several fields at once (a model validator's error has no field of its own)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


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
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.headers = headers or {}

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
        headers = dict(self.headers)
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


def adapter_not_loaded(adapter: str) -> OpenAIError:
    """A LoRA adapter once served that no worker holds now (unloaded, or every holder
    gone): load it again with ``dynamoctl lora load``."""
    return OpenAIError(
        404,
        f"The LoRA adapter '{adapter}' is not loaded on any worker "
        "(dynamoctl lora load puts it back).",
        type="not_found_error",
        param="model",
        code="model_not_found",
    )


def model_unavailable(model: str, retry_after: float = 1.0) -> OpenAIError:
    """A model that was served and has no worker right now: retry, it is not a typo."""
    return OpenAIError(
        503,
        f"The model '{model}' has no worker available right now; retry later.",
        type="service_unavailable",
        param="model",
        code="model_unavailable",
        retry_after=retry_after,
    )


def overloaded(message: str, retry_after: float = 1.0) -> OpenAIError:
    return OpenAIError(
        503, message, type="service_unavailable", code="overloaded", retry_after=retry_after
    )


def too_large(limit: int) -> OpenAIError:
    # Closes: the rest of the body is still coming, and reading it to keep the
    # connection would cost as much as accepting it.
    return OpenAIError(413, f"request body exceeds {limit} bytes", headers={"Connection": "close"})


def invalid_api_key(message: str) -> OpenAIError:
    return OpenAIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def internal_error() -> OpenAIError:
    """A bug: no detail (it is logged), and the connection closes, since what state it
    was left in is unknown."""
    return OpenAIError(
        500,
        "The server had an error while processing your request.",
        type="server_error",
        headers={"Connection": "close"},
    )
