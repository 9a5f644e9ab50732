"""A recipe's ``security`` section (the locks on the planes and on a managed etcd) and
the secret values it and other sections reference rather than write (docs/security.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Discriminator, Tag, model_validator

from dynamoctl.recipe.fields import LocalPath, NonEmptyStr, RecipeModel, rule_error


class SecretSource(RecipeModel):
    """Where a secret is read, on the supervisor's host, right before an instance starts:
    exactly one of ``from_env`` and ``from_file``. The value never appears in the recipe,
    the plan, ``state.json``, a dry run or a command line (docs/security.md)."""

    from_env: NonEmptyStr | None = None
    """Name of an environment variable of the supervisor (``dynamoctl up``), e.g.
    ``HF_TOKEN``."""
    from_file: LocalPath | None = None
    """Path of a file holding the value (a trailing newline is dropped), e.g.
    ``~/.cache/huggingface/token``."""

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretSource:
        if (self.from_env is None) == (self.from_file is None):
            raise rule_error("", "give exactly one of from_env and from_file")
        return self


class Security(RecipeModel):
    """Who may talk to the deployment's processes (docs/security.md). The defaults lock
    every target whose components listen on a network address (ssh, slurm) and leave a
    single user's machine (local) as it is."""

    curve: bool | None = None
    """Authenticate and encrypt the request and event planes with ZeroMQ CURVE, with a
    key generated for the deployment: processes without it cannot connect. Default: on for
    ssh and slurm targets, off for local."""
    etcd_tls: bool | None = None
    """Serve a managed etcd (``discovery.managed``) over TLS with certificates made for
    the deployment, client certificates required: only the deployment's processes can
    read or write discovery. Default: on for ssh and slurm targets, off for local."""
    open_endpoint: bool = False
    """Serve the OpenAI endpoint without API keys although the target spans several hosts
    and the frontend listens on a network address. ``up`` refuses such a recipe unless it
    names keys (``frontend.api_keys_file`` or ``frontend.api_keys_env``) or says this: an
    open endpoint on a cluster network is a choice to write down, not a default."""


ENV_VALUE_TAGS = frozenset({"plain", "secret"})
"""The forms of an env value; pydantic puts the one meant in an error's location."""
EnvValue = Annotated[
    Annotated[str, Tag("plain")] | Annotated[SecretSource, Tag("secret")],
    Discriminator(lambda value: "secret" if isinstance(value, dict | SecretSource) else "plain"),
]
"""An environment value, or where a secret one is read (errors name only the form meant)."""
